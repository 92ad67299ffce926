/*
 * kvlayout.h - the kernel ABI of kvlayout (one header for CUDA, HIP and host C/C++).
 *
 * `kvl_field_args` describes where one field (K, V, a scale, a latent, ...) of a paged KV
 * cache lives: 64-bit byte strides, extents and the element type. It mirrors, member for
 * member, the Rust `#[repr(C)]` struct `KvFieldArgs` in crates/kvlayout/src/abi.rs, which
 * builds it from a validated layout (`KvCacheLayout::kernel_args`).
 *
 * Kernels take this struct by value and address memory only through `kvl_offset`; they never
 * take positional stride integers or read a tensor shape. Offsets are 64-bit byte offsets
 * relative to the base pointer of buffer `buffer` (0, or 1 for V when K and V are separate
 * allocations). Codes of `dtype` and `field` are the KVL_DTYPE_* and KVL_FIELD_* constants.
 * `kvl_offset` is defined on the domain only (the layout was validated so that no offset in
 * it overflows); a kernel that receives untrusted coordinates checks `kvl_in_domain` first.
 */
#ifndef KVLAYOUT_H
#define KVLAYOUT_H

#if defined(__CUDACC_RTC__)
/* NVRTC has no system headers; these are its fixed-width types on every CUDA target. */
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__CUDA__) || defined(__HIP__)
#define KVL_FN static inline __host__ __device__
#else
#define KVL_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (`DType::abi_code`). */
enum {
    KVL_DTYPE_F32 = 0,
    KVL_DTYPE_F16 = 1,
    KVL_DTYPE_BF16 = 2,
    KVL_DTYPE_FP8_E4M3 = 3,
    KVL_DTYPE_FP8_E5M2 = 4,
    KVL_DTYPE_INT8 = 5,
    KVL_DTYPE_U8 = 6
};

/* Fields (`field_code`). */
enum {
    KVL_FIELD_K = 0,
    KVL_FIELD_V = 1,
    KVL_FIELD_K_SCALE = 2,
    KVL_FIELD_V_SCALE = 3,
    KVL_FIELD_LATENT = 4,
    KVL_FIELD_BYTES = 5,
    KVL_FIELD_CONV = 6,
    KVL_FIELD_SSM = 7
};

/* Kernel arguments of one field; 144 bytes, 8-byte aligned, no implicit padding. */
typedef struct kvl_field_args {
    int64_t base_offset_bytes;      /* offset of element (0,0,0,0,0) */
    int64_t layer_stride_bytes;
    int64_t block_stride_bytes;
    int64_t head_stride_bytes;
    int64_t slot_stride_bytes;      /* token/state slots */
    int64_t dim_chunk_stride_bytes; /* between chunks d / dim_split */
    int64_t dim_stride_bytes;       /* between elements d % dim_split */
    int64_t num_layers;
    int64_t num_blocks;
    int64_t num_heads;
    int64_t num_slots;
    int64_t width;                  /* elements per row of the field */
    int64_t dim_split;              /* == width when the row is not split */
    int64_t block_size;             /* tokens per block */
    int64_t tokens_per_state;       /* 0: one state per block (Mamba) */
    int32_t buffer;
    int32_t dtype;                  /* KVL_DTYPE_* */
    int32_t elem_bytes;
    int32_t field;                  /* KVL_FIELD_* */
    float scale;                    /* per-tensor scale (k_scale / v_scale, else 1) */
    int32_t reserved;               /* zero */
} kvl_field_args;

#if defined(__cplusplus)
static_assert(sizeof(kvl_field_args) == 144, "kvl_field_args must be 144 bytes");
static_assert(alignof(kvl_field_args) == 8, "kvl_field_args must be 8-byte aligned");
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(kvl_field_args) == 144, "kvl_field_args must be 144 bytes");
_Static_assert(_Alignof(kvl_field_args) == 8, "kvl_field_args must be 8-byte aligned");
#else /* C99: a negative array size fails the build */
typedef char kvl_field_args_must_be_144_bytes[sizeof(kvl_field_args) == 144 ? 1 : -1];
#endif

/* Byte offset of element (layer, block, head, slot, dim), relative to buffer `a->buffer`. */
KVL_FN int64_t kvl_offset(const kvl_field_args *a, int64_t layer, int64_t block, int64_t head,
                          int64_t slot, int64_t dim)
{
    return a->base_offset_bytes + layer * a->layer_stride_bytes + block * a->block_stride_bytes +
           head * a->head_stride_bytes + slot * a->slot_stride_bytes +
           (dim / a->dim_split) * a->dim_chunk_stride_bytes +
           (dim % a->dim_split) * a->dim_stride_bytes;
}

/* 1 when the coordinate is in the field's domain, else 0. */
KVL_FN int kvl_in_domain(const kvl_field_args *a, int64_t layer, int64_t block, int64_t head,
                         int64_t slot, int64_t dim)
{
    return layer >= 0 && layer < a->num_layers && block >= 0 && block < a->num_blocks &&
           head >= 0 && head < a->num_heads && slot >= 0 && slot < a->num_slots && dim >= 0 &&
           dim < a->width;
}

/* The slot holding a token position of a block (0 <= token_in_block < block_size). */
KVL_FN int64_t kvl_slot_of_token(const kvl_field_args *a, int64_t token_in_block)
{
    return a->tokens_per_state == 0 ? 0 : token_in_block / a->tokens_per_state;
}

#ifdef __cplusplus
}
#endif

#endif /* KVLAYOUT_H */
