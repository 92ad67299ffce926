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
 * access outside them ends the launch with an error), and a wide access (8 or 16 bytes at
 * once, which a GPU faults on when misaligned) for its alignment; on a GPU the checks are
 * compiled out.
 */
#if defined(KVL_EMU)
#define KVL_CHECK_ACCESS(p, n)                                                                 \
    do {                                                                                       \
        if (!kvl_emu_access_ok((const void *)(p), (n)))                                        \
            kvl_trap();                                                                        \
    } while (0)
#define KVL_CHECK_ALIGNED(p, n)                                                                \
    do {                                                                                       \
        if (((uint64_t)(uintptr_t)(p) & (uint64_t)((n) - 1)) != 0)                             \
            kvl_trap();                                                                        \
    } while (0)
#else
#define KVL_CHECK_ACCESS(p, n) ((void)0)
#define KVL_CHECK_ALIGNED(p, n) ((void)0)
#endif

/*
 * Traffic recording (emulator, when a launch records; kvl_emu_traffic.h): every global load
 * and store goes through an accessor that names its call site, so the emulator can group the
 * lanes' accesses into warp requests. Cache memory: kvl_at (an element the caller stores),
 * kvl_at_c (an element the caller loads), kvl_copy_unit (movers); kvl_addr / kvl_addr_c give a
 * checked address without recording, for callers that pass it to kvl_copy_unit. Everything
 * else (activations, outputs, partials, block table, slot mapping, pairs): kvl_act, kvl_ld,
 * kvl_st. A kernel that makes an access itself (a 16-byte vector load) states it on the same
 * line with KVL_CACHE_LOAD / KVL_CACHE_STORE (checked and recorded) or KVL_GLOBAL_LOAD /
 * KVL_GLOBAL_STORE (recorded). On a GPU the recording compiles away and the accessors are
 * plain loads and stores.
 */
#if defined(KVL_EMU)
typedef uint64_t kvl_site_t;
#define KVL_SITE (::std::integral_constant<uint64_t, kvl_emu_site(__FILE__, __LINE__)>::value)
#define KVL_RECORD(p, n, kind, site) kvl_emu_record((const void *)(p), (int64_t)(n), (kind), (site))
/* *p (a global other than the cache), recorded as a load. */
template <class T> KVL_DEVICE T kvl_ld_at(const T *p, kvl_site_t site)
{
    KVL_RECORD(p, sizeof(T), KVL_TRAFFIC_OTHER_LOAD, site);
    return *p;
}
/* *p = x (a global other than the cache), recorded as a store. */
template <class T, class U> KVL_DEVICE void kvl_st_at(T *p, U x, kvl_site_t site)
{
    KVL_RECORD(p, sizeof(T), KVL_TRAFFIC_OTHER_STORE, site);
    *p = (T)x;
}
#define kvl_ld(p) kvl_ld_at((p), KVL_SITE)
#define kvl_st(p, x) kvl_st_at((p), (x), KVL_SITE)
/* An access of n bytes at p that the caller makes itself (a vector load or store), on the
 * same line, once per lane and access: cache ones are checked against the launch's buffers,
 * all are recorded. */
#define KVL_CACHE_LOAD(p, n)                                                                   \
    do {                                                                                       \
        KVL_CHECK_ACCESS(p, n);                                                                \
        KVL_RECORD(p, n, KVL_TRAFFIC_CACHE_LOAD, KVL_SITE);                                    \
    } while (0)
#define KVL_CACHE_STORE(p, n)                                                                  \
    do {                                                                                       \
        KVL_CHECK_ACCESS(p, n);                                                                \
        KVL_RECORD(p, n, KVL_TRAFFIC_CACHE_STORE, KVL_SITE);                                   \
    } while (0)
#define KVL_GLOBAL_LOAD(p, n) KVL_RECORD(p, n, KVL_TRAFFIC_OTHER_LOAD, KVL_SITE)
#define KVL_GLOBAL_STORE(p, n) KVL_RECORD(p, n, KVL_TRAFFIC_OTHER_STORE, KVL_SITE)
#else
typedef int kvl_site_t;
#define KVL_SITE 0
#define KVL_RECORD(p, n, kind, site) ((void)(site))
#define kvl_ld(p) (*(p))
#define kvl_st(p, x) ((void)(*(p) = (x)))
#define KVL_CACHE_LOAD(p, n) ((void)0)
#define KVL_CACHE_STORE(p, n) ((void)0)
#define KVL_GLOBAL_LOAD(p, n) ((void)0)
#define KVL_GLOBAL_STORE(p, n) ((void)0)
#endif

/* Element i of a dense activation tensor (f32, f16 or bf16) as f32. */
KVL_DEVICE float kvl_act_at(const void *t, int dtype, int64_t i, kvl_site_t site)
{
    if (dtype == KVL_DTYPE_F32) {
        KVL_CHECK_ACCESS((const float *)t + i, 4);
        KVL_RECORD((const float *)t + i, 4, KVL_TRAFFIC_OTHER_LOAD, site);
        return ((const float *)t)[i];
    }
    KVL_CHECK_ACCESS((const uint16_t *)t + i, 2);
    KVL_RECORD((const uint16_t *)t + i, 2, KVL_TRAFFIC_OTHER_LOAD, site);
    uint16_t bits = ((const uint16_t *)t)[i];
    return dtype == KVL_DTYPE_F16 ? kvl_f16_to_f32(bits) : kvl_bf16_to_f32(bits);
}
#define kvl_act(t, dtype, i) kvl_act_at((t), (dtype), (i), KVL_SITE)

/* Address of element (layer, block, head, slot, dim) of a field, in its buffer (checked by
 * the emulator, not recorded). */
KVL_DEVICE unsigned char *kvl_addr(unsigned char *const *buffers, const kvl_field_args *a,
                                   int64_t layer, int64_t block, int64_t head, int64_t slot,
                                   int64_t dim)
{
    unsigned char *p = buffers[a->buffer] + KVL_OFFSET(a, layer, block, head, slot, dim);
    KVL_CHECK_ACCESS(p, a->elem_bytes);
    return p;
}

KVL_DEVICE const unsigned char *kvl_addr_c(const unsigned char *const *buffers,
                                           const kvl_field_args *a, int64_t layer,
                                           int64_t block, int64_t head, int64_t slot,
                                           int64_t dim)
{
    const unsigned char *p = buffers[a->buffer] + KVL_OFFSET(a, layer, block, head, slot, dim);
    KVL_CHECK_ACCESS(p, a->elem_bytes);
    return p;
}

/* The address of an element the caller stores (recorded as a cache store of its size). */
KVL_DEVICE unsigned char *kvl_at_site(unsigned char *const *buffers, const kvl_field_args *a,
                                      int64_t layer, int64_t block, int64_t head, int64_t slot,
                                      int64_t dim, kvl_site_t site)
{
    unsigned char *p = kvl_addr(buffers, a, layer, block, head, slot, dim);
    KVL_RECORD(p, a->elem_bytes, KVL_TRAFFIC_CACHE_STORE, site);
    return p;
}

/* The address of an element the caller loads (recorded as a cache load of its size). */
KVL_DEVICE const unsigned char *kvl_at_c_site(const unsigned char *const *buffers,
                                              const kvl_field_args *a, int64_t layer,
                                              int64_t block, int64_t head, int64_t slot,
                                              int64_t dim, kvl_site_t site)
{
    const unsigned char *p = kvl_addr_c(buffers, a, layer, block, head, slot, dim);
    KVL_RECORD(p, a->elem_bytes, KVL_TRAFFIC_CACHE_LOAD, site);
    return p;
}

#define kvl_at(buffers, a, layer, block, head, slot, dim)                                      \
    kvl_at_site((buffers), (a), (layer), (block), (head), (slot), (dim), KVL_SITE)
#define kvl_at_c(buffers, a, layer, block, head, slot, dim)                                    \
    kvl_at_c_site((buffers), (a), (layer), (block), (head), (slot), (dim), KVL_SITE)

/*
 * Sixteen bytes moved as one vector access (`ld.global.v4.u32` / `st.global.v4.u32` in PTX,
 * `global_load_dwordx4` on AMDGPU): the address must be a multiple of 16, which the Rust side
 * checks from the descriptor and the buffer addresses before it chooses a 16-byte path.
 * `kvl_load16` / `kvl_store16` are cache accesses, checked and recorded at the caller's site.
 */
#if defined(__CUDACC_RTC__)
/* NVRTC has no vector_size: a 16-aligned struct of four words, loaded as one vector. */
struct alignas(16) kvl_u128_words {
    uint32_t w[4];
};
typedef struct kvl_u128_words kvl_u128;
#define KVL_U128_WORD(v, i) ((v).w[i])
#else
typedef uint32_t kvl_u128 __attribute__((vector_size(16)));
#define KVL_U128_WORD(v, i) ((v)[i]) /* word i (0..3) of a kvl_u128 */
#endif
static_assert(sizeof(kvl_u128) == 16 && alignof(kvl_u128) == 16, "kvl_u128 is 16 bytes");

/* The vector of words a (lowest address) to d. */
KVL_DEVICE kvl_u128 kvl_u128_of(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
    kvl_u128 v;
    KVL_U128_WORD(v, 0) = a;
    KVL_U128_WORD(v, 1) = b;
    KVL_U128_WORD(v, 2) = c;
    KVL_U128_WORD(v, 3) = d;
    return v;
}

KVL_DEVICE kvl_u128 kvl_load16_at(const unsigned char *p, kvl_site_t site)
{
    KVL_CHECK_ACCESS(p, 16);
    KVL_CHECK_ALIGNED(p, 16);
    KVL_RECORD(p, 16, KVL_TRAFFIC_CACHE_LOAD, site);
    return *(const kvl_u128 *)p;
}

KVL_DEVICE void kvl_store16_at(unsigned char *p, kvl_u128 x, kvl_site_t site)
{
    KVL_CHECK_ACCESS(p, 16);
    KVL_CHECK_ALIGNED(p, 16);
    KVL_RECORD(p, 16, KVL_TRAFFIC_CACHE_STORE, site);
    *(kvl_u128 *)p = x;
}

#define kvl_load16(p) kvl_load16_at((p), KVL_SITE)
#define kvl_store16(p, x) kvl_store16_at((p), (x), KVL_SITE)

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
