/*
 * kvlayout.hip - the HIP translation unit of the kvlayout kernels: the same kernel bodies as
 * CUDA (kernels-cuda/src), through the same portability header, whose HIP section maps the
 * primitives to AMDGPU builtins with the wavefront width of the target (64 on CDNA, 32 on
 * RDNA). Built to code objects by scripts/kernels.sh.
 */
#include "kvl_port.h"
#include "write_kv.cuh"
#include "paged_decode.cuh"
#include "move_blocks.cuh"
