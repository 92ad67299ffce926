/*
 * kvl_port.h - the few GPU primitives the kernels use, for four targets: CUDA (clang-19,
 * no CUDA headers), CUDA under NVRTC or nvcc (the run-time fallback of the CUDA backend),
 * HIP (clang-19, no ROCm headers) and the host emulator (C++20,
 * kernels-cuda/emu/kvl_emu.h). Kernel bodies (the .cuh files of kernels-cuda/src) include this header and
 * nothing vendor-specific, so CUDA and HIP share one algorithm source.
 *
 * What every target defines:
 *   KVL_KERNEL            qualifier of a kernel entry point (returns void)
 *   KVL_DEVICE            qualifier of a device helper (static inline)
 *   KVL_WARP              warp / wavefront width, a compile-time constant (32 or 64)
 *   kvl_lane_mask_t       an unsigned integer of KVL_WARP bits
 *   kvl_thread()          threadIdx.x (blocks are one-dimensional in threads)
 *   kvl_threads()         blockDim.x (a multiple of KVL_WARP, chosen by the launch config)
 *   kvl_block_x/y/z()     blockIdx.x/y/z
 *   kvl_blocks_x/y/z()    gridDim.x/y/z
 *   kvl_sync()            __syncthreads(): every thread of the block that has not returned
 *   kvl_shfl_xor(v, m)    the float of lane (lane ^ m) of the warp; all lanes take part
 *   kvl_ballot(p)         bit i set when lane i's predicate is non-zero; all lanes take part
 *   KVL_SHARED(T, n, c)   declares `T n[c]` in block shared memory (or a T* to it)
 *   kvl_dyn_shared()      the block's dynamic shared memory (unsigned char *, 16-aligned)
 *   kvl_exp2(x)           2^x in f32 (hardware approximation on GPUs)
 *   KVL_INF               +infinity as a float
 *   kvl_trap()            ends the kernel with an error (the emulator reports it to Rust)
 */
#ifndef KVL_PORT_H
#define KVL_PORT_H

#if !defined(KVL_EMU) && (defined(__CUDA__) || defined(__HIP__))
/* What the vendor headers would define, for kvlayout.h's functions. */
#ifndef __host__
#define __host__ __attribute__((host))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#endif

#if defined(KVL_EMU)
/* ---------------------------------------------------------------- host emulator */
#include "kvl_emu.h"

#elif defined(__CUDA__) && defined(__CUDA_ARCH__)
/* ---------------------------------------------------------------- CUDA, clang-19 */
#define KVL_KERNEL extern "C" __attribute__((global)) void
#define KVL_DEVICE static inline __attribute__((device))
#define KVL_WARP 32
typedef unsigned int kvl_lane_mask_t;

KVL_DEVICE unsigned kvl_thread(void) { return __nvvm_read_ptx_sreg_tid_x(); }
KVL_DEVICE unsigned kvl_threads(void) { return __nvvm_read_ptx_sreg_ntid_x(); }
KVL_DEVICE unsigned kvl_block_x(void) { return __nvvm_read_ptx_sreg_ctaid_x(); }
KVL_DEVICE unsigned kvl_block_y(void) { return __nvvm_read_ptx_sreg_ctaid_y(); }
KVL_DEVICE unsigned kvl_block_z(void) { return __nvvm_read_ptx_sreg_ctaid_z(); }
KVL_DEVICE unsigned kvl_blocks_x(void) { return __nvvm_read_ptx_sreg_nctaid_x(); }
KVL_DEVICE unsigned kvl_blocks_y(void) { return __nvvm_read_ptx_sreg_nctaid_y(); }
KVL_DEVICE unsigned kvl_blocks_z(void) { return __nvvm_read_ptx_sreg_nctaid_z(); }
KVL_DEVICE void kvl_sync(void) { __nvvm_bar_sync(0); }
KVL_DEVICE float kvl_shfl_xor(float v, int lane_mask)
{
    return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, lane_mask, 0x1f);
}
KVL_DEVICE kvl_lane_mask_t kvl_ballot(int pred) { return __nvvm_vote_ballot_sync(0xffffffffu, pred); }
#define KVL_SHARED(type, name, count) __attribute__((shared)) type name[count]
extern __attribute__((shared)) __attribute__((aligned(16))) unsigned char kvl_dyn_smem[];
KVL_DEVICE unsigned char *kvl_dyn_shared(void) { return kvl_dyn_smem; }
KVL_DEVICE float kvl_exp2(float x) { return __nvvm_ex2_approx_f(x); }
KVL_DEVICE void kvl_trap(void) { __builtin_trap(); }
#define KVL_INF __builtin_inff()

#elif (defined(__CUDACC_RTC__) || (defined(__NVCC__) && !defined(__clang__))) && defined(__CUDA_ARCH__)
/* ---------------------------------------------------------------- CUDA, NVRTC or nvcc */
#define KVL_KERNEL extern "C" __global__ void
#define KVL_DEVICE static __forceinline__ __device__
#define KVL_WARP 32
typedef unsigned int kvl_lane_mask_t;

KVL_DEVICE unsigned kvl_thread(void) { return threadIdx.x; }
KVL_DEVICE unsigned kvl_threads(void) { return blockDim.x; }
KVL_DEVICE unsigned kvl_block_x(void) { return blockIdx.x; }
KVL_DEVICE unsigned kvl_block_y(void) { return blockIdx.y; }
KVL_DEVICE unsigned kvl_block_z(void) { return blockIdx.z; }
KVL_DEVICE unsigned kvl_blocks_x(void) { return gridDim.x; }
KVL_DEVICE unsigned kvl_blocks_y(void) { return gridDim.y; }
KVL_DEVICE unsigned kvl_blocks_z(void) { return gridDim.z; }
KVL_DEVICE void kvl_sync(void) { __syncthreads(); }
KVL_DEVICE float kvl_shfl_xor(float v, int lane_mask)
{
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
KVL_DEVICE kvl_lane_mask_t kvl_ballot(int pred) { return __ballot_sync(0xffffffffu, pred); }
#define KVL_SHARED(type, name, count) __shared__ type name[count]
extern __shared__ __align__(16) unsigned char kvl_dyn_smem[];
KVL_DEVICE unsigned char *kvl_dyn_shared(void) { return kvl_dyn_smem; }
/* The instruction clang's __nvvm_ex2_approx_f emits, so both builds round alike. */
KVL_DEVICE float kvl_exp2(float x)
{
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
KVL_DEVICE void kvl_trap(void) { __trap(); }
#define KVL_INF __int_as_float(0x7f800000)

#elif defined(__HIP__) && defined(__AMDGCN__)
/* ---------------------------------------------------------------- HIP / AMDGPU, clang-19 */
#define KVL_KERNEL                                                                             \
    extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(1, 1024))) void
#define KVL_DEVICE static inline __attribute__((device))
#define KVL_WARP __AMDGCN_WAVEFRONT_SIZE__
#if KVL_WARP == 64
typedef unsigned long long kvl_lane_mask_t;
#else
typedef unsigned int kvl_lane_mask_t;
#endif

KVL_DEVICE unsigned kvl_thread(void) { return __builtin_amdgcn_workitem_id_x(); }
KVL_DEVICE unsigned kvl_threads(void) { return __builtin_amdgcn_workgroup_size_x(); }
KVL_DEVICE unsigned kvl_block_x(void) { return __builtin_amdgcn_workgroup_id_x(); }
KVL_DEVICE unsigned kvl_block_y(void) { return __builtin_amdgcn_workgroup_id_y(); }
KVL_DEVICE unsigned kvl_block_z(void) { return __builtin_amdgcn_workgroup_id_z(); }
KVL_DEVICE unsigned kvl_blocks_x(void)
{
    return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x();
}
KVL_DEVICE unsigned kvl_blocks_y(void)
{
    return __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y();
}
KVL_DEVICE unsigned kvl_blocks_z(void)
{
    return __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z();
}
KVL_DEVICE void kvl_sync(void)
{
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
KVL_DEVICE unsigned kvl_lane_id(void)
{
#if KVL_WARP == 64
    return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
#else
    return __builtin_amdgcn_mbcnt_lo(~0u, 0u);
#endif
}
KVL_DEVICE float kvl_shfl_xor(float v, int lane_mask)
{
    int src = (int)(kvl_lane_id() ^ (unsigned)lane_mask);
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src << 2, __builtin_bit_cast(int, v)));
}
KVL_DEVICE kvl_lane_mask_t kvl_ballot(int pred)
{
#if KVL_WARP == 64
    return __builtin_amdgcn_ballot_w64(pred != 0);
#else
    return __builtin_amdgcn_ballot_w32(pred != 0);
#endif
}
#define KVL_SHARED(type, name, count) __attribute__((shared)) type name[count]
extern __attribute__((shared)) __attribute__((aligned(16))) unsigned char kvl_dyn_smem[];
KVL_DEVICE unsigned char *kvl_dyn_shared(void) { return kvl_dyn_smem; }
KVL_DEVICE float kvl_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
KVL_DEVICE void kvl_trap(void) { __builtin_trap(); }
#define KVL_INF __builtin_inff()

#else
#error "kvl_port.h: compile as CUDA (clang-19, NVRTC, nvcc) or HIP (clang-19) device code, or define KVL_EMU"
#endif

#include "kvlayout.h"

/* Derived, the same on every target. */
KVL_DEVICE unsigned kvl_lane(void) { return kvl_thread() % KVL_WARP; }
KVL_DEVICE unsigned kvl_warp(void) { return kvl_thread() / KVL_WARP; }
KVL_DEVICE unsigned kvl_warps(void) { return kvl_threads() / KVL_WARP; }

#endif /* KVL_PORT_H */
