/*
 * kvl_dtype.h - element conversions of the kernels: decode one stored element of any
 * KVL_DTYPE_* to f32 and encode an f32 back, for CUDA and HIP device code (clang-19, no vendor
 * headers) and host C/C++ (the emulator). Integer bit operations only, so every target gives
 * the same bits whatever its float modes (no libdevice, no memcpy, no std headers).
 *
 * Bit-exact with the CPU crate's `elem` module (crates/kvlayout-cpu/src/elem.rs: `encode`,
 * `decode`, `quant_max`, `inline_scale`), which is the specification. Each conversion follows:
 *   f16   the Rust `half` 2.7.1 `f16::from_f32` / `f16::to_f32` (software path; round to
 *         nearest even, overflow to infinity, NaN quieted with its payload's top bits kept)
 *   bf16  `half` 2.7.1 `bf16::from_f32` / `bf16::to_f32` (same rules; a NaN gets its top
 *         mantissa bit, 0x0040, set)
 *   fp8   the `float8` crate 0.7.0 `F8E4M3` / `F8E5M2` `from_f32` / `to_f32`, a port of
 *         NVIDIA's `cuda_fp8.hpp` with saturation: round to nearest even, infinities and
 *         values past the largest finite one saturate to it (e4m3 448, e5m2 57344), NaN is
 *         e4m3 0x7F and e5m2 0x7E | f32 mantissa bit 21, sign kept; decoding gives the f16
 *         NaN 0x7FFF as f32 (0x7FFFE000, sign dropped) for every NaN code
 *   int8  Rust `(x.round().clamp(-127.0, 127.0) as i8) as u8`: half away from zero,
 *         saturated at +-127, NaN to 0
 *   u8    Rust `x.round().clamp(0.0, 255.0) as u8`
 * Elements are loaded and stored whole, aligned to their size (see kvl_load_elem).
 */
#ifndef KVL_DTYPE_H
#define KVL_DTYPE_H

#include "kvlayout.h"

/* ------------------------------------------------------------------ bits of an f32 */

#if defined(__cplusplus)
KVL_FN uint32_t kvl_f32_as_bits(float x) { return __builtin_bit_cast(uint32_t, x); }
KVL_FN float kvl_bits_as_f32(uint32_t b) { return __builtin_bit_cast(float, b); }
#else
KVL_FN uint32_t kvl_f32_as_bits(float x)
{
    union { float f; uint32_t u; } v;
    v.f = x;
    return v.u;
}
KVL_FN float kvl_bits_as_f32(uint32_t b)
{
    union { float f; uint32_t u; } v;
    v.u = b;
    return v.f;
}
#endif

/* NVRTC has its own names for two of the builtins below. */
#if defined(__CUDACC_RTC__)
#define KVL_MEMCPY_ memcpy
#define KVL_CLZ32_(v) __clz((int)(v))
#else
#define KVL_MEMCPY_ __builtin_memcpy
#define KVL_CLZ32_(v) __builtin_clz(v)
#endif

/* Number of leading zeros of a non-zero 32-bit value. */
KVL_FN int kvl_clz32_(uint32_t v) { return KVL_CLZ32_(v); }

/* ------------------------------------------------------------------ f16 (half 2.7.1) */

KVL_FN float kvl_f16_to_f32(uint16_t h)
{
    uint32_t x = h;
    uint32_t sign = (x & 0x8000u) << 16;
    uint32_t ex = x & 0x7C00u;
    uint32_t man = x & 0x03FFu;
    if ((x & 0x7FFFu) == 0)
        return kvl_bits_as_f32(sign);
    if (ex == 0x7C00u) /* infinity, or NaN: quieted, payload kept */
        return kvl_bits_as_f32(sign | (man == 0 ? 0x7F800000u : (0x7FC00000u | (man << 13))));
    if (ex == 0) { /* subnormal: normalize */
        int shift = kvl_clz32_(man) - 21; /* brings the leading one to bit 10 */
        uint32_t e = (uint32_t)(113 - shift) << 23;
        return kvl_bits_as_f32(sign | e | ((man << (shift + 13)) & 0x7FFFFFu));
    }
    return kvl_bits_as_f32(sign | (((ex >> 10) + 112u) << 23) | (man << 13));
}

KVL_FN uint16_t kvl_f32_to_f16(float f)
{
    uint32_t x = kvl_f32_as_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ex = x & 0x7F800000u;
    uint32_t man = x & 0x007FFFFFu;
    if (ex == 0x7F800000u) /* infinity, or NaN: quieted, top payload bits kept */
        return (uint16_t)(sign | 0x7C00u | (man != 0 ? 0x0200u : 0u) | (man >> 13));
    int half_exp = (int)(ex >> 23) - 127 + 15;
    if (half_exp >= 0x1F)
        return (uint16_t)(sign | 0x7C00u);
    if (half_exp <= 0) {
        if (14 - half_exp > 24)
            return (uint16_t)sign;
        man |= 0x00800000u;
        uint32_t half_man = man >> (14 - half_exp);
        uint32_t round_bit = 1u << (13 - half_exp);
        if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0)
            half_man += 1;
        return (uint16_t)(sign | half_man);
    }
    uint32_t r = sign | ((uint32_t)half_exp << 10) | (man >> 13);
    if ((man & 0x1000u) != 0 && (man & 0x2FFFu) != 0)
        r += 1; /* may carry into the exponent: the next binade, or infinity */
    return (uint16_t)r;
}

/* ------------------------------------------------------------------ bf16 (half 2.7.1) */

KVL_FN float kvl_bf16_to_f32(uint16_t h)
{
    uint32_t x = h;
    if ((x & 0x7FFFu) > 0x7F80u) /* NaN: set the top mantissa bit */
        x |= 0x0040u;
    return kvl_bits_as_f32(x << 16);
}

KVL_FN uint16_t kvl_f32_to_bf16(float f)
{
    uint32_t x = kvl_f32_as_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    uint32_t r = x >> 16;
    if ((x & 0x8000u) != 0 && (x & 0x17FFFu) != 0)
        r += 1;
    return (uint16_t)r;
}

/* ------------------------------------------------------------------ fp8 (float8 0.7.0) */

/*
 * cuda_fp8.hpp's __nv_cvt_double_to_fp8 with __NV_SATFINITE, as the float8 crate does it on
 * the f64 of the input, here on the f32 bits (the f64 of an f32 is exact). `mbits`: mantissa
 * bits, `bias`: exponent bias; thresholds are f32 magnitudes as bits: at most `zero_max`
 * gives zero, above `sat_above` the largest finite `max_code`, from `min_normal` on normal.
 */
KVL_FN uint8_t kvl_f32_to_fp8_(float x, int mbits, int bias, uint32_t zero_max, uint32_t sat_above,
                               uint32_t min_normal, uint32_t max_code, int e5m2)
{
    uint32_t b = kvl_f32_as_bits(x);
    uint32_t sign = (b >> 24) & 0x80u;
    uint32_t a = b & 0x7FFFFFFFu;
    uint32_t man = b & 0x007FFFFFu;
    int ex = (int)(a >> 23) - 127 + bias;
    uint32_t res;
    if (a <= zero_max) {
        res = 0;
    } else if (a > 0x7F800000u) {
        /* e5m2: 0x7E | the top two mantissa bits of the f64, i.e. the quiet bit (0x7E has it)
         * and f32 mantissa bit 21 */
        res = e5m2 ? (0x7Eu | ((b >> 21) & 1u)) : 0x7Fu;
    } else if (a > sat_above) {
        res = max_code;
    } else if (a >= min_normal) {
        uint32_t m = man >> (23 - mbits);
        uint32_t hulp = 1u << (22 - mbits); /* half an ulp of the fp8 */
        uint32_t rnd = man & ((hulp << 1) - 1u);
        res = ((uint32_t)ex << mbits) | m;
        if (rnd > hulp || (rnd == hulp && (m & 1u) != 0))
            res += 1;
    } else { /* subnormal */
        int shift = 1 - ex;
        uint32_t m = ((man >> (23 - mbits)) | (1u << mbits)) >> shift;
        uint32_t hulp = (1u << (22 - mbits)) << shift;
        uint32_t rnd = (man | 0x00800000u) & ((hulp << 1) - 1u);
        if (rnd > hulp || (rnd == hulp && (m & 1u) != 0))
            m += 1;
        res = m;
    }
    return (uint8_t)(res | sign);
}

/* Zero up to 2^-10, saturate above 464 (the midpoint of 448 and 480; 464 itself rounds to even,
 * 448), normal from 2^-6, largest finite 0x7E (448). */
KVL_FN uint8_t kvl_f32_to_fp8_e4m3(float x)
{
    return kvl_f32_to_fp8_(x, 3, 7, 0x3A800000u, 0x43E80000u, 0x3C800000u, 0x7Eu, 0);
}

/* Zero up to 2^-17, saturate from 61440 (the midpoint of 57344 and 65536) on, normal from
 * 2^-14, largest finite 0x7B (57344). */
KVL_FN uint8_t kvl_f32_to_fp8_e5m2(float x)
{
    return kvl_f32_to_fp8_(x, 2, 15, 0x37000000u, 0x476FFFFFu, 0x38800000u, 0x7Bu, 1);
}

/* float8 decodes through f16 (`to_f16().to_f32_const()`); e4m3 0x7F/0xFF is the f16 NaN 0x7FFF. */
KVL_FN float kvl_fp8_e4m3_to_f32(uint8_t v)
{
    uint32_t sign = ((uint32_t)v & 0x80u) << 24;
    uint32_t e = ((uint32_t)v >> 3) & 0xFu;
    uint32_t m = (uint32_t)v & 0x7u;
    if ((v & 0x7Fu) == 0x7Fu)
        return kvl_bits_as_f32(0x7FFFE000u);
    if (e == 0) {
        if (m == 0)
            return kvl_bits_as_f32(sign);
        int p = 31 - kvl_clz32_(m); /* m * 2^-9 = 2^(p-9) * 1.f */
        return kvl_bits_as_f32(sign | ((uint32_t)(p + 118) << 23) | ((m << (23 - p)) & 0x7FFFFFu));
    }
    return kvl_bits_as_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* e5m2 is the top byte of an f16; its NaNs decode to the f16 NaN 0x7FFF (sign dropped). */
KVL_FN float kvl_fp8_e5m2_to_f32(uint8_t v)
{
    uint32_t h = (uint32_t)v << 8;
    if ((h & 0x7FFFu) > 0x7C00u)
        return kvl_bits_as_f32(0x7FFFE000u);
    return kvl_f16_to_f32((uint16_t)h);
}

/* ------------------------------------------------------------------ int8, u8 */

/* Round half away from zero of 0.5 <= |x| < 2^8, given its bits `a` (sign cleared). */
KVL_FN uint32_t kvl_round_mag_(uint32_t a)
{
    int e = (int)(a >> 23) - 127; /* -1 ..= 7 */
    uint32_t sig = (a & 0x007FFFFFu) | 0x00800000u;
    return (sig + (1u << (22 - e))) >> (23 - e);
}

KVL_FN uint8_t kvl_f32_to_int8(float x)
{
    uint32_t b = kvl_f32_as_bits(x);
    uint32_t a = b & 0x7FFFFFFFu;
    uint32_t n;
    if (a > 0x7F800000u) /* NaN */
        return 0;
    if (a >= 0x42FD0000u) /* |x| >= 126.5 */
        n = 127;
    else if (a < 0x3F000000u) /* |x| < 0.5 */
        n = 0;
    else
        n = kvl_round_mag_(a);
    return (uint8_t)((b >> 31) != 0 ? 0u - n : n);
}

KVL_FN float kvl_int8_to_f32(uint8_t v) { return (float)(int8_t)v; }

KVL_FN uint8_t kvl_f32_to_u8(float x)
{
    uint32_t b = kvl_f32_as_bits(x);
    if (b >= 0x7F800001u) /* negative (also -0, -inf, any NaN) or positive NaN */
        return 0;
    if (b >= 0x437E8000u) /* x >= 254.5, +inf */
        return 255;
    if (b < 0x3F000000u) /* x < 0.5 */
        return 0;
    return (uint8_t)kvl_round_mag_(b);
}

KVL_FN float kvl_u8_to_f32(uint8_t v) { return (float)v; }

/* ------------------------------------------------------------------ any dtype */

/*
 * Elements are loaded and stored whole: `p` is aligned to the element's size, which the
 * descriptor guarantees for every element of a cache (each stride and the base offset are
 * multiples of it, and the backends refuse buffers not aligned to it). Little-endian targets
 * (x86-64, NVIDIA, AMD).
 */
KVL_FN uint16_t kvl_ld16_(const unsigned char *p)
{
    uint16_t v;
    KVL_MEMCPY_(&v, __builtin_assume_aligned(p, 2), 2);
    return v;
}
KVL_FN uint32_t kvl_ld32_(const unsigned char *p)
{
    uint32_t v;
    KVL_MEMCPY_(&v, __builtin_assume_aligned(p, 4), 4);
    return v;
}
KVL_FN void kvl_st16_(unsigned char *p, uint16_t v)
{
    KVL_MEMCPY_(__builtin_assume_aligned(p, 2), &v, 2);
}
KVL_FN void kvl_st32_(unsigned char *p, uint32_t v)
{
    KVL_MEMCPY_(__builtin_assume_aligned(p, 4), &v, 4);
}

/* Decodes the element of `dtype` (KVL_DTYPE_*) at `p`; 0 for an unknown code. */
KVL_FN float kvl_load_elem(const unsigned char *p, int dtype)
{
    switch (dtype) {
    case KVL_DTYPE_F32:
        return kvl_bits_as_f32(kvl_ld32_(p));
    case KVL_DTYPE_F16:
        return kvl_f16_to_f32(kvl_ld16_(p));
    case KVL_DTYPE_BF16:
        return kvl_bf16_to_f32(kvl_ld16_(p));
    case KVL_DTYPE_FP8_E4M3:
        return kvl_fp8_e4m3_to_f32(p[0]);
    case KVL_DTYPE_FP8_E5M2:
        return kvl_fp8_e5m2_to_f32(p[0]);
    case KVL_DTYPE_INT8:
        return kvl_int8_to_f32(p[0]);
    case KVL_DTYPE_U8:
        return kvl_u8_to_f32(p[0]);
    default:
        return 0.0f;
    }
}

/* Encodes `x` as an element of `dtype` at `p`; nothing for an unknown code. */
KVL_FN void kvl_store_elem(unsigned char *p, int dtype, float x)
{
    switch (dtype) {
    case KVL_DTYPE_F32:
        kvl_st32_(p, kvl_f32_as_bits(x));
        break;
    case KVL_DTYPE_F16:
        kvl_st16_(p, kvl_f32_to_f16(x));
        break;
    case KVL_DTYPE_BF16:
        kvl_st16_(p, kvl_f32_to_bf16(x));
        break;
    case KVL_DTYPE_FP8_E4M3:
        p[0] = kvl_f32_to_fp8_e4m3(x);
        break;
    case KVL_DTYPE_FP8_E5M2:
        p[0] = kvl_f32_to_fp8_e5m2(x);
        break;
    case KVL_DTYPE_INT8:
        p[0] = kvl_f32_to_int8(x);
        break;
    case KVL_DTYPE_U8:
        p[0] = kvl_f32_to_u8(x);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------------ scales */

/* Largest finite magnitude of a quantized dtype (int8: 127); FLT_MAX otherwise. */
KVL_FN float kvl_quant_max(int dtype)
{
    switch (dtype) {
    case KVL_DTYPE_FP8_E4M3:
        return 448.0f;
    case KVL_DTYPE_FP8_E5M2:
        return 57344.0f;
    case KVL_DTYPE_INT8:
        return 127.0f;
    default:
        return 3.40282347e38f;
    }
}

/* Scale of a row quantized with an inline scale: amax / qmax (1 for an all-zero row). */
KVL_FN float kvl_inline_scale(int dtype, float amax)
{
    return amax > 0.0f ? amax / kvl_quant_max(dtype) : 1.0f;
}

#endif /* KVL_DTYPE_H */
