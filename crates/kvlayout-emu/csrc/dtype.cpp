/*
 * The kernels' element conversions (kernels-cuda/include/kvl_dtype.h) compiled for the host,
 * so a test can compare them bit for bit with the CPU crate's encoders.
 */
#include "kvlayout.h"
#include "kvl_dtype.h"

extern "C" void kvl_emu_encode(int dtype, float x, unsigned char *out)
{
    kvl_store_elem(out, dtype, x);
}

extern "C" float kvl_emu_decode(int dtype, const unsigned char *bytes)
{
    return kvl_load_elem(bytes, dtype);
}
