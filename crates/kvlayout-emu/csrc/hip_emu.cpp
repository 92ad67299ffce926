/* The HIP kernel sources (kernels-hip/src/kvlayout.hip) under the emulator, wavefronts of 64. */
#define KVL_EMU 1
#define KVL_WARP 64
#define KVL_EMU_SOURCE "kvlayout.hip"
#define KVL_EMU_NS kvl_hip_emu
#define KVL_EMU_PREFIX(name) kvl_hip_emu_##name
#include "emu_entry.h"
