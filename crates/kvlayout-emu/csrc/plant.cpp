/*
 * A deliberately broken build of the CUDA kernel sources (KVL_PLANT = n, see
 * kernels-cuda/src/kvl_plant.cuh), for the tests only: entry points kvl_plant<n>_*.
 */
#define KVL_EMU 1
#define KVL_WARP 32
#define KVL_EMU_SOURCE "kvlayout.cu"
#define KVL_CAT2(a, b) a##b
#define KVL_CAT(a, b) KVL_CAT2(a, b)
#define KVL_EMU_NS KVL_CAT(kvl_plant_ns, KVL_PLANT)
#define KVL_EMU_PREFIX(name) KVL_CAT(KVL_CAT(KVL_CAT(kvl_plant, KVL_PLANT), _), name)
#include "emu_entry.h"
