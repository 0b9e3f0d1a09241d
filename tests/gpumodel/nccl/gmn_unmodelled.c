/*
 * gmn_unmodelled: NCCL functions the CPU model does not implement. Each is
 * exported so that a binary calling one gets a clear error instead of a
 * symbol lookup failure: a violation ("... is not modelled") and
 * ncclInvalidUsage (also recorded in an open group). A test that needs one
 * fails under GM_STRICT; the model must grow it first (see README.md).
 */
#include "gmn.h"

#include "gm_model.h"

static ncclResult_t unmodelled(ncclComm_t comm, const char *name)
{
    gm_violation("nccl: %s is not modelled by the CPU model of NCCL (tests/gpumodel/nccl)", name);
    struct ncclComm *c = comm && gmn_comm_check(comm, name) == ncclSuccess ? comm : NULL;
    ncclResult_t r = gmn_fail(c, ncclInvalidUsage, "%s is not modelled by the CPU model of NCCL", name);
    gmn_group_error(r);
    return r;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)sendbuff, (void)count, (void)datatype, (void)peer, (void)stream;
    return unmodelled(comm, "ncclSend");
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)recvbuff, (void)count, (void)datatype, (void)peer, (void)stream;
    return unmodelled(comm, "ncclRecv");
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                            ncclConfig_t *config, int shrinkFlags)
{
    (void)excludeRanksList, (void)excludeRanksCount, (void)config, (void)shrinkFlags;
    if (newcomm)
        *newcomm = NULL;
    return unmodelled(comm, "ncclCommShrink");
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    (void)revokeFlags;
    return unmodelled(comm, "ncclCommRevoke");
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
    (void)buff, (void)size, (void)winFlags;
    if (win)
        *win = NULL;
    return unmodelled(comm, "ncclCommWindowRegister");
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    (void)win;
    return unmodelled(comm, "ncclCommWindowDeregister");
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm)
{
    (void)op, (void)scalar, (void)datatype, (void)residence;
    return unmodelled(comm, "ncclRedOpCreatePreMulSum");
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    (void)op;
    return unmodelled(comm, "ncclRedOpDestroy");
}

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    (void)simInfo;
    return unmodelled(NULL, "ncclGroupSimulateEnd");
}
