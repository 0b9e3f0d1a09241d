/*
 * The NCCL model across processes: run under `mpirun --oversubscribe -np 4`
 * (any N >= 2; even N for the split). Rank 0 makes the unique id, MPI_Bcast
 * shares it, every process joins the shared-memory communicator. Checked
 * against host references computed here (small integers: exact sums):
 * all-reduce (sum, in place), all-gather in place (offset rank * count, so
 * every rank but 0 has a nonzero offset), reduce-scatter out of place,
 * broadcast from the last rank, a split into halves (rows) with an
 * all-reduce in each, a mismatched collective reported as an asynchronous
 * error on every rank, and an abort on one rank releasing the others.
 * Exit 0 when every rank passed; each failure printed with its rank.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

#include "gm_model.h"

static int me, np, failures;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            fprintf(stderr, "test_nccl_mpi: rank %d: line %d: ", me, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                         \
            fprintf(stderr, "\n");                                \
            failures++;                                           \
        }                                                         \
    } while (0)
#define NOK(call) CHECK((call) == ncclSuccess, "%s: %s", #call, ncclGetLastError(NULL))

#define N 70000u /* elements: several shared-memory rounds */

static float val(int r, size_t i)
{
    return (float)((r + 1) * 100 + (int)(i % 1013));
}

static void collectives(ncclComm_t comm, cudaStream_t st)
{
    size_t n = (size_t)np;
    float *h = malloc(n * N * sizeof *h), *d = NULL, *x = NULL;
    cudaMalloc((void **)&d, n * N * sizeof(float));
    cudaMalloc((void **)&x, N * sizeof(float));
    /* all-reduce in place */
    for (size_t i = 0; i < N; i++)
        h[i] = val(me, i);
    cudaMemcpy(x, h, N * sizeof *h, cudaMemcpyHostToDevice);
    NOK(ncclAllReduce(x, x, N, ncclFloat, ncclSum, comm, st));
    cudaStreamSynchronize(st);
    cudaMemcpy(h, x, N * sizeof *h, cudaMemcpyDeviceToHost);
    for (size_t i = 0, bad = 0; i < N && !bad; i++) {
        double s = 0;
        for (int q = 0; q < np; q++)
            s += val(q, i);
        bad = h[i] != (float)s;
        CHECK(!bad, "allreduce element %zu is %g, expected %g", i, (double)h[i], s);
    }
    /* all-gather in place: this rank's part at d + me * N */
    for (size_t i = 0; i < N; i++)
        h[i] = val(me, i);
    cudaMemcpy(d + (size_t)me * N, h, N * sizeof *h, cudaMemcpyHostToDevice);
    NOK(ncclAllGather(d + (size_t)me * N, d, N, ncclFloat, comm, st));
    cudaStreamSynchronize(st);
    cudaMemcpy(h, d, n * N * sizeof *h, cudaMemcpyDeviceToHost);
    for (size_t j = 0, bad = 0; j < n * N && !bad; j++) {
        bad = h[j] != val((int)(j / N), j % N);
        CHECK(!bad, "allgather element %zu is %g, expected %g", j, (double)h[j], (double)val((int)(j / N), j % N));
    }
    /* reduce-scatter out of place */
    for (size_t j = 0; j < n * N; j++)
        h[j] = val(me, j);
    cudaMemcpy(d, h, n * N * sizeof *h, cudaMemcpyHostToDevice);
    NOK(ncclReduceScatter(d, x, N, ncclFloat, ncclSum, comm, st));
    cudaStreamSynchronize(st);
    cudaMemcpy(h, x, N * sizeof *h, cudaMemcpyDeviceToHost);
    for (size_t i = 0, bad = 0; i < N && !bad; i++) {
        double s = 0;
        for (int q = 0; q < np; q++)
            s += val(q, (size_t)me * N + i);
        bad = h[i] != (float)s;
        CHECK(!bad, "reducescatter element %zu is %g, expected %g", i, (double)h[i], s);
    }
    /* broadcast from the last rank */
    for (size_t i = 0; i < N; i++)
        h[i] = val(me, i);
    cudaMemcpy(x, h, N * sizeof *h, cudaMemcpyHostToDevice);
    NOK(ncclBroadcast(x, x, N, ncclFloat, np - 1, comm, st));
    cudaStreamSynchronize(st);
    cudaMemcpy(h, x, N * sizeof *h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == val(np - 1, 0) && h[N - 1] == val(np - 1, N - 1), "broadcast gave %g", (double)h[0]);
    cudaFree(d);
    cudaFree(x);
    free(h);
}

static void split_rows(ncclComm_t world, cudaStream_t st)
{
    ncclComm_t row = NULL;
    NOK(ncclCommSplit(world, me / 2, me, &row, NULL));
    if (!row)
        return;
    int n = 0, r = -1;
    NOK(ncclCommCount(row, &n));
    NOK(ncclCommUserRank(row, &r));
    CHECK(n == 2 && r == me % 2, "row: count %d rank %d", n, r);
    float h[8], *d = NULL;
    cudaMalloc((void **)&d, sizeof h);
    for (int i = 0; i < 8; i++)
        h[i] = val(me, (size_t)i);
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    NOK(ncclAllReduce(d, d, 8, ncclFloat, ncclSum, row, st));
    cudaStreamSynchronize(st);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int base = me / 2 * 2;
    CHECK(h[3] == val(base, 3) + val(base + 1, 3), "row allreduce gave %g", (double)h[3]);
    cudaFree(d);
    NOK(ncclCommDestroy(row));
}

/* Every rank but the last calls a collective of another count: all report it. */
static void mismatch(cudaStream_t st)
{
    ncclUniqueId id;
    if (me == 0)
        ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c = NULL;
    NOK(ncclCommInitRank(&c, np, id, me));
    float *d = NULL;
    cudaMalloc((void **)&d, (8 + 4 * (size_t)np) * sizeof(float));
    gm_violations_reset();
    NOK(ncclAllGather(d, d + 8, me == np - 1 ? 4 : 2, ncclFloat, c, st));
    cudaStreamSynchronize(st);
    ncclResult_t a = ncclSuccess;
    NOK(ncclCommGetAsyncError(c, &a));
    CHECK(a == ncclInvalidUsage, "mismatch: async error %s", ncclGetErrorString(a));
    CHECK(gm_violations() == 1, "mismatch: %d violations on this rank, expected 1", gm_violations());
    gm_violations_reset();
    NOK(ncclCommAbort(c));
    cudaFree(d);
}

/* The last rank aborts instead of joining a collective: the others'
 * communicators report ncclRemoteError; their collectives end when they
 * abort in turn. */
static void abort_peer(cudaStream_t st)
{
    ncclUniqueId id;
    if (me == 0)
        ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c = NULL;
    NOK(ncclCommInitRank(&c, np, id, me));
    float *d = NULL;
    cudaMalloc((void **)&d, 64 * sizeof(float));
    if (me != np - 1) {
        NOK(ncclAllReduce(d, d, 64, ncclFloat, ncclSum, c, st));
        MPI_Barrier(MPI_COMM_WORLD);
        ncclResult_t a = ncclSuccess;
        for (int i = 0; i < 5000 && a != ncclRemoteError; i++) {
            NOK(ncclCommGetAsyncError(c, &a));
            usleep(1000);
        }
        CHECK(a == ncclRemoteError, "after the peer's abort: async error %s", ncclGetErrorString(a));
        CHECK(cudaStreamQuery(st) == cudaErrorNotReady, "the collective ended before this rank aborted");
        NOK(ncclCommAbort(c));
        CHECK(cudaStreamSynchronize(st) == cudaSuccess, "the stream failed after the abort");
    } else {
        NOK(ncclCommAbort(c));
        MPI_Barrier(MPI_COMM_WORLD);
    }
    cudaFree(d);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    ncclUniqueId id;
    if (me == 0 && ncclGetUniqueId(&id) != ncclSuccess)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t world = NULL;
    cudaStream_t st;
    cudaStreamCreate(&st);
    NOK(ncclCommInitRank(&world, np, id, me));
    if (world) {
        collectives(world, st);
        if (np % 2 == 0)
            split_rows(world, st);
        NOK(ncclCommFinalize(world));
        NOK(ncclCommDestroy(world));
    }
    if (np >= 2) {
        mismatch(st);
        abort_peer(st);
    }
    cudaStreamDestroy(st);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0)
        printf("test_nccl_mpi: %d ranks, %d failures\n", np, total);
    MPI_Finalize();
    return total ? 1 : 0;
}
