//! The decode's Rust-side choices, with the values worked out by hand from each layout: which
//! rows take 16-byte loads, how many lanes read a key row, which value layout is read with
//! lanes over tokens, and how many partitions fill the device.

use kvlayout::ops::DecodeShape;
use kvlayout::{Field, KvCacheLayout};
use kvlayout_device::kernels::{
    decode_partition_tokens, decode_rows, paged_decode_launch, row_vec_bytes, DecodeRows,
    GpuTarget, PARTITION_TOKENS,
};

fn layout(spec: &str) -> KvCacheLayout {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn rows(spec: &str, bases: [u64; 2], target: &GpuTarget) -> DecodeRows {
    decode_rows(&layout(spec), bases, target).unwrap()
}

/// `(k_vec_bytes, v_vec_bytes, k_token_lanes, v_token_major)`.
fn paths(r: DecodeRows) -> (u32, u32, u32, bool) {
    (
        r.k_vec_bytes,
        r.v_vec_bytes,
        r.k_token_lanes,
        r.v_token_major,
    )
}

#[test]
fn rows_that_are_aligned_runs_take_sixteen_byte_loads() {
    let (cuda, cdna) = (GpuTarget::CUDA, GpuTarget::CDNA);
    // bf16 D = 128: 256-byte rows, 16 vectors, 16 lanes a row (2 rows per warp of 32).
    let nhd = "kv L=1 B=3 N=16 H=4 D=128 dtype=bf16 order=NHD";
    assert_eq!(paths(rows(nhd, [0x1000, 0], &cuda)), (16, 16, 16, false));
    assert_eq!(paths(rows(nhd, [0x1000, 0], &cdna)), (16, 16, 16, false));
    // A buffer 8 bytes off a multiple of 16: elements, a warp a row.
    assert_eq!(paths(rows(nhd, [0x1008, 0], &cuda)), (0, 0, 32, false));
    assert_eq!(paths(rows(nhd, [0x1008, 0], &cdna)), (0, 0, 64, false));
    // fp8 D = 128 head-major: 128-byte rows, 8 vectors of 16 elements.
    let fp8 = "kv L=1 B=3 N=16 H=4 D=128 dtype=fp8_e4m3 order=HND";
    assert_eq!(paths(rows(fp8, [0, 0], &cuda)), (16, 16, 8, false));
    // f32 D = 8: 32-byte rows, 2 vectors of 4 elements.
    let f32 = "kv L=2 B=3 N=16 H=4 D=8 dtype=f32 order=NHD";
    assert_eq!(paths(rows(f32, [0, 0], &cuda)), (16, 16, 2, false));
    // bf16 D = 40: 80-byte rows, 5 vectors, rounded up to 8 lanes.
    let d40 = "kv L=1 B=3 N=16 H=4 D=40 dtype=bf16 order=NHD";
    assert_eq!(paths(rows(d40, [0, 0], &cuda)), (16, 16, 8, false));
    // bf16 D = 36: 72-byte rows are no whole number of vectors.
    let d36 = "kv L=1 B=3 N=16 H=4 D=36 dtype=bf16 order=NHD";
    assert_eq!(paths(rows(d36, [0, 0], &cuda)), (0, 0, 32, false));
    // fp8 D = 8: 8-byte rows.
    let short = "kv L=2 B=3 N=16 H=4 D=8 dtype=fp8_e4m3 order=HND";
    assert_eq!(paths(rows(short, [0, 0], &cuda)), (0, 0, 32, false));
    // MLA bf16: the 576-element latent is 72 vectors (a whole warp a row); the value is its
    // first 512 elements, 64 vectors at the latent's row starts (multiples of 1152).
    let mla = "mla L=1 B=3 N=16 rank=512 rope=64 dtype=bf16 order=NHD";
    assert_eq!(paths(rows(mla, [0, 0], &cuda)), (16, 16, 32, false));
    assert_eq!(paths(rows(mla, [0, 0], &cdna)), (16, 16, 64, false));
}

#[test]
fn padding_and_offsets_decide_by_their_alignment() {
    let cuda = GpuTarget::CUDA;
    // f16 D = 8 NHD: a page of K then V is 2 x 16 x 4 x 16 = 2048 bytes.
    let padded = layout("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=2112");
    let k = padded.field_map(Field::K).unwrap();
    assert_eq!(k.strides.block, 2112);
    assert_eq!(row_vec_bytes(&k, 0), 16, "2112 = 132 x 16");
    let odd = layout("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=2056");
    let k = odd.field_map(Field::K).unwrap();
    assert_eq!(k.strides.block, 2056);
    assert_eq!(row_vec_bytes(&k, 0), 0, "2056 = 128 x 16 + 8");
    // A base offset of 8 bytes moves every row start off the 16-byte grid.
    let based = layout("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD base=8");
    assert_eq!(
        paths(rows(
            "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD base=8",
            [0, 0],
            &cuda
        )),
        (0, 0, 32, false)
    );
    assert_eq!(based.field_map(Field::K).unwrap().strides.base_offset, 8);
    // One head: its (unaligned) head stride is never used.
    let one = layout("kv L=1 B=3 N=16 H=1 D=8 dtype=f16 order=NHD");
    assert_eq!(row_vec_bytes(&one.field_map(Field::V).unwrap(), 0), 16);
}

#[test]
fn legacy_layouts_keep_elements_and_read_values_by_token() {
    let cuda = GpuTarget::CUDA;
    // Key [B, H, D/x, N, x]: 16-byte pieces N x 16 bytes apart, no run; value [B, H, D, N]:
    // tokens 2 bytes apart for one element.
    let legacy = "kv L=2 B=3 N=16 H=2 D=32 dtype=f16 tensor=vllm-paged-v1";
    assert_eq!(paths(rows(legacy, [0, 0], &cuda)), (0, 0, 32, true));
    let v = layout(legacy).field_map(Field::V).unwrap();
    assert_eq!((v.strides.slot, v.strides.dim), (2, 32));
    // Head-major rows are not token-major: their slot stride is the row.
    assert!(
        !rows(
            "kv L=2 B=3 N=16 H=2 D=32 dtype=f16 order=HND",
            [0, 0],
            &cuda
        )
        .v_token_major
    );
}

#[test]
fn inline_scale_rows_take_the_wide_path_by_their_own_alignment() {
    let spec = "kv-scaled L=1 B=3 N=16 H=2 D=16 Dv=8 dtype=int8 order=NHD";
    let l = layout(spec);
    let (k, v) = (
        l.field_map(Field::K).unwrap(),
        l.field_map(Field::V).unwrap(),
    );
    // Per (slot, head) 32 bytes: 16 int8 keys and their f32 scale, then 8 int8 values (at
    // 20) and theirs; slots 64 bytes apart, blocks 1024.
    assert_eq!(
        (k.strides.head, k.strides.slot, k.strides.block),
        (32, 64, 1024)
    );
    assert_eq!(v.strides.base_offset, 20);
    // Keys: one aligned vector a row, a lane a row; values: 8 bytes at odd offsets.
    assert_eq!(
        paths(rows(spec, [0, 0], &GpuTarget::CUDA)),
        (16, 0, 1, false)
    );
}

fn shape(seqs: usize, q_heads: usize, group: usize, width: usize) -> DecodeShape {
    DecodeShape {
        seqs,
        q_heads,
        group,
        qk_width: width,
        v_width: width,
    }
}

#[test]
fn partitions_fill_the_device_at_small_batches() {
    let h100 = GpuTarget::CUDA;
    assert_eq!(h100.sm_count, 132);
    let r = DecodeRows::default();
    // Llama-3-8B layer, 8 x 1024: 8 sequences x 8 KV heads (tile 4) = 64 blocks a partition;
    // 528 wanted (4 per SM) -> 9 partitions -> 114 tokens -> 128 (whole granules) -> 8.
    let llama = shape(8, 32, 4, 128);
    let l = paged_decode_launch(&h100, &llama, 1024, &r)
        .unwrap()
        .unwrap();
    assert_eq!(
        (l.group_tile, l.partition_tokens, l.partitions),
        (4, 128, 8)
    );
    let blocks = l.main.grid.x * l.main.grid.y * l.main.grid.z;
    assert_eq!(blocks, 512);
    assert!(blocks >= h100.sm_count);
    assert!(l.reduce.is_some());
    // 32 x 4096: 256 blocks a partition already; partitions of the most, 512 tokens.
    let l = paged_decode_launch(&h100, &shape(32, 32, 4, 128), 4096, &r)
        .unwrap()
        .unwrap();
    assert_eq!((l.partition_tokens, l.partitions), (PARTITION_TOKENS, 8));
    // MI300X, 304 CUs: 1216 wanted over 64 -> 19 -> 54 tokens -> 64 -> 16 partitions.
    let l = paged_decode_launch(&GpuTarget::CDNA, &llama, 1024, &r)
        .unwrap()
        .unwrap();
    assert_eq!((l.partition_tokens, l.partitions), (64, 16));
    // Short sequences (under two granules) stay one pass.
    let l = paged_decode_launch(&h100, &shape(1, 32, 4, 128), 100, &r)
        .unwrap()
        .unwrap();
    assert_eq!((l.partition_tokens, l.partitions, l.reduce), (100, 1, None));
    // 66 sequences x 8 KV heads = 528 blocks, as many as wanted: no split below 512 tokens;
    // 64 sequences (512 blocks) want 2 -> 200 -> 256.
    assert_eq!(decode_partition_tokens(&h100, 528, 400), 400);
    assert_eq!(decode_partition_tokens(&h100, 512, 400), 256);
    // A device-reported count replaces the default: 78 SMs want 312 / 64 -> 5 -> 205 -> 256.
    assert_eq!(
        decode_partition_tokens(&h100.with_sm_count(78), 64, 1024),
        256
    );
    assert_eq!(h100.with_sm_count(0), h100);
    // MLA, 2 sequences x 16 tiles of 8 heads: 528 / 32 -> 17 -> 241 -> 256 a partition.
    let l = paged_decode_launch(&h100, &shape(2, 128, 128, 576), 4096, &r)
        .unwrap()
        .unwrap();
    assert_eq!(
        (l.group_tile, l.partition_tokens, l.partitions),
        (8, 256, 16)
    );
}

#[test]
fn values_read_by_token_keep_one_offset_per_token_in_shared_memory() {
    let by_token = DecodeRows {
        k_token_lanes: 32,
        v_token_major: true,
        ..DecodeRows::default()
    };
    // One SM wants 4 blocks; 3 sequences x 4 KV heads are 12: one pass of 300 tokens.
    let one_sm = GpuTarget::CUDA.with_sm_count(1);
    let s = shape(3, 8, 2, 128);
    let plain = paged_decode_launch(&one_sm, &s, 300, &DecodeRows::default())
        .unwrap()
        .unwrap();
    let legacy = paged_decode_launch(&one_sm, &s, 300, &by_token)
        .unwrap()
        .unwrap();
    // Tile 2 x (128 + 300) floats, then 300 offsets of 8 bytes.
    assert_eq!(plain.main.dyn_shared_bytes, 2 * 4 * (128 + 300));
    assert_eq!(legacy.main.dyn_shared_bytes, 2 * 4 * (128 + 300) + 8 * 300);
    assert_eq!(legacy.rows, by_token);
}
