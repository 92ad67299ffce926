/* The HIP kernels use the one kernel ABI header of kvlayout; this is not a copy. */
#include "../../kernels-cuda/include/kvlayout.h"
