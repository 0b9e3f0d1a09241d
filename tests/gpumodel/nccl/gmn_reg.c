/*
 * gmn_reg: buffer registration (ncclCommRegister/Deregister) and NCCL's
 * allocator (ncclMemAlloc/Free) in the NCCL model.
 *
 * A registration is any range the CUDA model tracks as device memory
 * (gm_check_range); its handle is only valid with the communicator that
 * made it (deregistering another is ncclInvalidArgument and a violation).
 * gmn_registered() tells a launch whether all its buffers are registered
 * (the `registered` count of gm_nccl.h). Memory comes from gm_alloc_nccl.
 */
#include "gmn.h"

#include <stdlib.h>
#include <string.h>

#include "gm_model.h"

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    ncclResult_t r = gmn_comm_check(comm, "ncclCommRegister");
    if (r != ncclSuccess)
        return r;
    if (!buff || !handle || size == 0)
        return gmn_fail(comm, ncclInvalidArgument, "ncclCommRegister: %s", !buff ? "buff is NULL"
                        : !handle ? "handle is NULL" : "size is 0");
    char err[512];
    if (gm_check_range(buff, size, "ncclCommRegister's buffer", err, sizeof err) != cudaSuccess)
        return gmn_fail(comm, ncclInvalidArgument, "ncclCommRegister: %s", err);
    gmn_reg *g = calloc(1, sizeof *g);
    if (!g)
        return gmn_fail(comm, ncclSystemError, "ncclCommRegister: out of memory");
    *g = (gmn_reg){.magic = GMN_REG_MAGIC, .comm = comm, .p = buff, .bytes = size};
    pthread_mutex_lock(&comm->reg_mu);
    g->next = comm->regs;
    comm->regs = g;
    pthread_mutex_unlock(&comm->reg_mu);
    *handle = g;
    return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    ncclResult_t r = gmn_comm_check(comm, "ncclCommDeregister");
    if (r != ncclSuccess)
        return r;
    pthread_mutex_lock(&comm->reg_mu);
    gmn_reg **pp = &comm->regs;
    while (*pp && *pp != handle)
        pp = &(*pp)->next;
    gmn_reg *g = *pp;
    if (g)
        *pp = g->next;
    pthread_mutex_unlock(&comm->reg_mu);
    if (!g) {
        gm_violation("nccl: ncclCommDeregister: handle %p is not a registration of communicator %s", handle,
                     comm->comm_name);
        return gmn_fail(comm, ncclInvalidArgument, "ncclCommDeregister: handle %p is not a registration of "
                        "communicator %s", handle, comm->comm_name);
    }
    g->magic = 0;
    free(g);
    return ncclSuccess;
}

bool gmn_registered(struct ncclComm *comm, const void *p, size_t bytes)
{
    const char *c = p;
    bool found = false;
    pthread_mutex_lock(&comm->reg_mu);
    for (gmn_reg *g = comm->regs; g && !found; g = g->next)
        found = c >= g->p && c + bytes <= g->p + g->bytes;
    pthread_mutex_unlock(&comm->reg_mu);
    return found;
}

ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr || size == 0)
        return gmn_fail(NULL, ncclInvalidArgument, "ncclMemAlloc: %s", !ptr ? "ptr is NULL" : "size is 0");
    cudaError_t e = gm_alloc_nccl(ptr, size);
    if (e != cudaSuccess)
        return gmn_fail(NULL, ncclUnhandledCudaError, "ncclMemAlloc of %zu bytes: %s", size, cudaGetErrorString(e));
    return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr)
{
    if (!ptr)
        return ncclSuccess;
    cudaError_t e = gm_free_nccl(ptr);
    if (e != cudaSuccess)
        return gmn_fail(NULL, ncclInvalidArgument, "ncclMemFree(%p): %s", ptr, cudaGetErrorString(e));
    return ncclSuccess;
}

