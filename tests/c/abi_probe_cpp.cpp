// Compiles kvlayout.h as C++ (as nvcc / hipcc see it), through kernels-hip/include/kvlayout.h,
// and exports what C++ sees of it.
#include <cstddef>
#include <cstdint>

// Through the HIP forwarding header, so that path is compiled too.
#include "../../kernels-hip/include/kvlayout.h"

static_assert(sizeof(kvl_field_args) == 144, "kvl_field_args is 144 bytes in C++");
static_assert(alignof(kvl_field_args) == 8, "kvl_field_args is 8-byte aligned in C++");
static_assert(offsetof(kvl_field_args, buffer) == 120, "int32 members start at byte 120");
static_assert(offsetof(kvl_field_args, reserved) == 140, "reserved is the last 4 bytes");

extern "C" {

std::size_t kvl_probe_cpp_sizeof(void) { return sizeof(kvl_field_args); }

std::int64_t kvl_probe_cpp_offset(const kvl_field_args *a, std::int64_t layer,
                                  std::int64_t block, std::int64_t head, std::int64_t slot,
                                  std::int64_t dim)
{
    return kvl_offset(a, layer, block, head, slot, dim);
}

}
