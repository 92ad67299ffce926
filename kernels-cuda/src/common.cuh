/*
 * common.cuh - helpers shared by the kernel bodies: activation loads, cache element access
 * through `kvl_offset`, and warp / block reductions. Written against kvl_port.h only, so the
 * same text compiles for CUDA, HIP and the host emulator.
 */
#ifndef KVL_COMMON_CUH
#define KVL_COMMON_CUH

#include "kvl_port.h"
#include "kvl_dtype.h"
#include "kvl_kernels.h"
#include "kvl_plant.cuh"

/*
 * The emulator checks every cache and activation access against the buffers of the launch (an
 * access outside them ends the launch with an error); on a GPU the check is compiled out.
 */
#if defined(KVL_EMU)
#define KVL_CHECK_ACCESS(p, n)                                                                 \
    do {                                                                                       \
        if (!kvl_emu_access_ok((const void *)(p), (n)))                                        \
            kvl_trap();                                                                        \
    } while (0)
#else
#define KVL_CHECK_ACCESS(p, n) ((void)0)
#endif

/* Element i of a dense activation tensor (f32, f16 or bf16) as f32. */
KVL_DEVICE float kvl_act(const void *t, int dtype, int64_t i)
{
    if (dtype == KVL_DTYPE_F32) {
        KVL_CHECK_ACCESS((const float *)t + i, 4);
        return ((const float *)t)[i];
    }
    KVL_CHECK_ACCESS((const uint16_t *)t + i, 2);
    uint16_t bits = ((const uint16_t *)t)[i];
    return dtype == KVL_DTYPE_F16 ? kvl_f16_to_f32(bits) : kvl_bf16_to_f32(bits);
}

/* Address of element (layer, block, head, slot, dim) of a field, in its buffer. */
KVL_DEVICE unsigned char *kvl_at(unsigned char *const *buffers, const kvl_field_args *a,
                                 int64_t layer, int64_t block, int64_t head, int64_t slot,
                                 int64_t dim)
{
    unsigned char *p = buffers[a->buffer] + KVL_OFFSET(a, layer, block, head, slot, dim);
    KVL_CHECK_ACCESS(p, a->elem_bytes);
    return p;
}

KVL_DEVICE const unsigned char *kvl_at_c(const unsigned char *const *buffers,
                                         const kvl_field_args *a, int64_t layer, int64_t block,
                                         int64_t head, int64_t slot, int64_t dim)
{
    const unsigned char *p = buffers[a->buffer] + KVL_OFFSET(a, layer, block, head, slot, dim);
    KVL_CHECK_ACCESS(p, a->elem_bytes);
    return p;
}

/*
 * Sixteen bytes moved as one vector access (`ld.v2.u64` / `st.v2.u64` in PTX,
 * `global_load_dwordx4` on AMDGPU): the address must be a multiple of 16, which the Rust side
 * checks from the descriptor and the buffer addresses before it chooses a 16-byte path.
 */
#if defined(__CUDACC_RTC__)
typedef uint4 kvl_u128; /* NVRTC has no vector_size; its built-in uint4 is 16 bytes, 16-aligned */
#else
typedef uint32_t kvl_u128 __attribute__((vector_size(16)));
#endif
static_assert(sizeof(kvl_u128) == 16 && alignof(kvl_u128) == 16, "kvl_u128 is 16 bytes");

/* The vector of words a (lowest address) to d. */
KVL_DEVICE kvl_u128 kvl_u128_of(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
#if defined(__CUDACC_RTC__)
    return make_uint4(a, b, c, d);
#else
    kvl_u128 v = {a, b, c, d};
    return v;
#endif
}

KVL_DEVICE kvl_u128 kvl_load16(const unsigned char *p)
{
    KVL_CHECK_ACCESS(p, 16);
    return *(const kvl_u128 *)p;
}

KVL_DEVICE void kvl_store16(unsigned char *p, kvl_u128 x)
{
    KVL_CHECK_ACCESS(p, 16);
    *(kvl_u128 *)p = x;
}

/* The larger of two floats; a NaN loses to a number (as Rust's f32::max). */
KVL_DEVICE float kvl_maxf(float a, float b)
{
    if (a != a)
        return b;
    return b > a ? b : a;
}

/* Sum over the lanes of a warp (every lane gets it). */
KVL_DEVICE float kvl_warp_sum(float x)
{
    for (int m = KVL_WARP / 2; m > 0; m /= 2)
        x += kvl_shfl_xor(x, m);
    return x;
}

/* Max over the lanes of a warp (every lane gets it). */
KVL_DEVICE float kvl_warp_max(float x)
{
    for (int m = KVL_WARP / 2; m > 0; m /= 2)
        x = kvl_maxf(x, kvl_shfl_xor(x, m));
    return x;
}

/*
 * Max (is_max) or sum over the block; every thread gets it. `scratch` holds one float per
 * warp. Every thread of the block must call it (it synchronizes twice).
 */
KVL_DEVICE float kvl_block_reduce(float x, int is_max, float *scratch)
{
    x = is_max ? kvl_warp_max(x) : kvl_warp_sum(x);
    if (kvl_lane() == 0)
        scratch[kvl_warp()] = x;
    kvl_sync();
    float r = scratch[0];
    for (unsigned w = 1; w < kvl_warps(); w++)
        r = is_max ? kvl_maxf(r, scratch[w]) : r + scratch[w];
    kvl_sync();
    return r;
}

/* 2^x via the target's exp2; e^x = 2^(x log2 e). */
KVL_DEVICE float kvl_exp(float x) { return kvl_exp2(x * 1.44269504088896341f); }

/* tanh from exp2: odd, |tanh| < 1; a polynomial near 0 where 1 - 2/(e^2x + 1) cancels. */
KVL_DEVICE float kvl_tanh(float x)
{
    float a = x < 0.0f ? -x : x;
    float t;
    if (a < 0.125f) {
        float a2 = a * a; /* x - x^3/3 + 2x^5/15 - 17x^7/315 */
        t = a * (1.0f + a2 * (-0.333333333f + a2 * (0.133333333f + a2 * -0.0539682540f)));
    } else if (a > 9.0f) {
        t = 1.0f;
    } else {
        t = 1.0f - 2.0f / (kvl_exp(2.0f * a) + 1.0f);
    }
    return x < 0.0f ? -t : t;
}

#endif /* KVL_COMMON_CUH */
