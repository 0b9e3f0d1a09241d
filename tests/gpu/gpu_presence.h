/*
 * gpu_presence: whether a device test may run, said honestly. A machine
 * without a GPU is one whose CUDA runtime counts no device or that has no
 * NVIDIA driver library at all (cudaGetDeviceCount then answers
 * cudaErrorInsufficientDriver too, so the driver library's absence is what
 * tells the cases apart): that is a skip. Any other failure -- a driver too
 * old for this CUDA, a broken install, a device the runtime cannot use --
 * is a failure, never a skip.
 */
#ifndef GPU_PRESENCE_H
#define GPU_PRESENCE_H

#include <dlfcn.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

enum { GPU_PRESENT = 0, GPU_BROKEN = 1, GPU_ABSENT = 77 };

/* GPU_PRESENT, GPU_ABSENT (printed: "no CUDA device: skipped") or GPU_BROKEN
 * (the error printed on stderr). */
static inline int gpu_presence(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e == cudaSuccess && ndev > 0)
        return GPU_PRESENT;
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver)
        dlclose(driver);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && ndev < 1) || !driver) {
        printf("no CUDA device: skipped (%s)\n", driver ? "the runtime counts none" : "no NVIDIA driver library");
        return GPU_ABSENT;
    }
    fprintf(stderr, "cudaGetDeviceCount: %s (%s): the NVIDIA driver is there but CUDA cannot use it\n",
            cudaGetErrorName(e), cudaGetErrorString(e));
    return GPU_BROKEN;
}

#endif
