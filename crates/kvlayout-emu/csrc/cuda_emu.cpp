/* The CUDA kernel sources (kernels-cuda/src/kvlayout.cu) under the emulator, warps of 32. */
#define KVL_EMU 1
#define KVL_WARP 32
#define KVL_EMU_SOURCE "kvlayout.cu"
#define KVL_EMU_NS kvl_cuda_emu
#define KVL_EMU_PREFIX(name) kvl_cuda_emu_##name
#include "emu_entry.h"
