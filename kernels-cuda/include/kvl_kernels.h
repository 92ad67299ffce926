/*
 * kvl_kernels.h - the parameter structs of the kvlayout kernels, one per kernel family. Each
 * kernel takes the `kvl_field_args` of the fields it touches by value and one of these structs
 * by value; nothing else. Mirrored member for member by the Rust `#[repr(C)]` structs in
 * crates/kvlayout/src/kernels/params.rs (a test checks sizes and offsets).
 *
 * None of them holds a stride or an extent of the cache: those come from the field arguments
 * (`kvl_offset`). Pointers are device addresses (8 bytes); `buffers[i]` is the base of cache
 * buffer i, which a field's `buffer` member names.
 */
#ifndef KVL_KERNELS_H
#define KVL_KERNELS_H

#include "kvlayout.h" /* its fixed-width integer types */

#ifdef __cplusplus
extern "C" {
#endif

/*
 * write_kv: grid (tokens, heads), one block per (token, head) row. Kernel:
 *   kvl_write_kv(kvl_field_args k, kvl_field_args v, kvl_field_args k_scale,
 *                kvl_field_args v_scale, kvl_write_params p)
 * `k` is the latent for MLA, where `v` is unused (`value` NULL).
 */
typedef struct kvl_write_params {
    const void *key;             /* [tokens, heads, k.width] activations */
    const void *value;           /* [tokens, heads, v.width] activations, or NULL */
    const int64_t *slot_mapping; /* [tokens]; negative = padding, skipped */
    unsigned char *buffers[2];   /* cache buffers */
    int64_t layer;
    int32_t act_dtype;           /* KVL_DTYPE_F32, _F16 or _BF16 */
    int32_t inline_scales;       /* 1: each row quantized with its own scale (k_scale/v_scale) */
    int32_t k_lane_bytes;        /* 16 or 8: bytes of a K row each lane stores; 0: one element */
    int32_t v_lane_bytes;        /* the same for V */
} kvl_write_params;

/*
 * paged_decode: grid (seqs, kv_heads x ceil(group / group_tile), partitions). Kernels:
 *   kvl_paged_decode(kvl_field_args k, kvl_field_args v, kvl_field_args k_scale,
 *                    kvl_field_args v_scale, kvl_decode_params p)
 *   kvl_paged_decode_reduce(kvl_field_args v, kvl_decode_params p)   (grid (seqs, q_heads))
 * Single pass (`partitions` 1, `partials` NULL): writes `out`. Partitioned: partition z of a
 * sequence attends to its tokens [z * partition_tokens, (z + 1) * partition_tokens) past the
 * window's start and writes (max logit, sum of weights, unnormalized output) to `partials`;
 * the reduce kernel combines them into `out`.
 */
typedef struct kvl_decode_params {
    const void *query;              /* [seqs, q_heads, k.width] activations */
    const int32_t *block_table;     /* [seqs, blocks_per_seq] */
    const uint32_t *seq_lens;       /* [seqs] */
    const unsigned char *buffers[2];/* cache buffers */
    float *out;                     /* [seqs, q_heads, v.width] */
    float *partials;                /* [seqs, q_heads, partitions, 2 + v.width], or NULL */
    int64_t layer;
    int64_t blocks_per_seq;         /* row length of the block table */
    int64_t q_heads;
    int64_t group;                  /* query heads per KV head */
    int64_t window;                 /* attend to the last `window` tokens; negative: all */
    int64_t partition_tokens;       /* tokens per block of the grid (a partition) */
    int32_t partitions;             /* partitions per sequence (grid z) */
    int32_t act_dtype;              /* of the query */
    int32_t inline_scales;          /* 1: rows carry their own scale (k_scale/v_scale) */
    float scale;                    /* softmax scale */
    float soft_cap;                 /* logits soft-cap c: l = c tanh(l / c) */
    int32_t soft_capped;            /* 1: apply soft_cap */
    int32_t group_tile;             /* query heads per block, 1..KVL_MAX_GROUP_TILE */
    int32_t k_vec_bytes;            /* 16: key rows read as 16-byte vectors (one run of bytes,
                                       every row start and the buffer 16-aligned); 0: elements */
    int32_t v_vec_bytes;            /* the same for value rows */
    int32_t k_token_lanes;          /* lanes per key row on the 16-byte path: a power of two
                                       up to the warp width */
    int32_t v_token_major;          /* 1: value tokens are contiguous for one element (legacy
                                       [blocks, heads, D, N]): lanes over tokens */
    int32_t reserved;               /* zero */
} kvl_decode_params;

/*
 * Block movers (copy_blocks, swap_blocks, gather_blocks, scatter_blocks, convert): one launch
 * per stored field, grid (pairs, layers x heads). Kernel:
 *   kvl_move_blocks(kvl_field_args src, kvl_field_args dst, kvl_move_params p)
 * Copies heads [head0, head0 + heads) of source block pairs[i][0] into heads from dst_head0 of
 * destination block pairs[i][1], every layer, slot and element.
 */
typedef struct kvl_move_params {
    const unsigned char *src_buffers[2];
    unsigned char *dst_buffers[2];
    const int64_t *pairs;           /* [n_pairs][2] (source block, destination block) */
    int64_t n_pairs;
    int64_t head0;
    int64_t heads;
    int64_t dst_head0;
    int32_t row_unit_bytes;         /* 0: element by element; else rows are one run of bytes on
                                       both sides, copied in units of this many bytes (1, 2, 4,
                                       8 or 16; every row start aligned to it on both sides) */
    int32_t reserved;               /* zero */
} kvl_move_params;

#ifdef __cplusplus
}
#endif

#endif /* KVL_KERNELS_H */
