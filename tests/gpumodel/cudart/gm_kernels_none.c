/*
 * gm_kernels_none: gm_kernels_find when the model is built without kernels/
 * (no `gm_kernels` target): no kernel has a host build, so every launch fails
 * with cudaErrorInvalidDeviceFunction naming the kernel.
 */
#include "../gm_model.h"

const gm_kernel *gm_kernels_find(const char *key)
{
    (void)key;
    return 0;
}
