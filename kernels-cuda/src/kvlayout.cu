/*
 * kvlayout.cu - the CUDA translation unit of the kvlayout kernels: the portability header,
 * then the kernel bodies, which HIP (kernels-hip/src/kvlayout.hip) and the host emulator
 * compile too. Built to PTX by scripts/kernels.sh.
 */
#include "kvl_port.h"
#include "write_kv.cuh"
#include "paged_decode.cuh"
#include "move_blocks.cuh"
