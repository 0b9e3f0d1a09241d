/*
 * NCCL collectives captured into CUDA graphs on the model. Two thread-ranks
 * each capture "copy a fresh input in, all-reduce it, all-gather the result"
 * on their own stream, instantiate the graph, and launch it several times
 * with a new input each time: every launch must exchange again (the
 * collectives are graph nodes run at each launch, in the graph's order), and
 * nothing may run at capture time. Expected values are computed here.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <nccl.h>

#include "gm_model.h"

#define NR 2
#define CNT 1000u
#define LAUNCHES 3

typedef struct graph_rank {
    int rank;
    ncclUniqueId id;
    char fail[512];
} graph_rank;

#define EXPECT(g, cond, ...)                                                  \
    do {                                                                      \
        if (!(cond) && !(g)->fail[0])                                         \
            snprintf((g)->fail, sizeof(g)->fail, __VA_ARGS__);                \
    } while (0)

static float input(int rank, int launch, size_t i)
{
    return (float)(rank * 1000 + launch * 100 + (int)(i % 89));
}

static void *rank_main(void *arg)
{
    graph_rank *g = arg;
    ncclComm_t comm = NULL;
    cudaStream_t st;
    float *in, *red, *all, *host, *pinned;
    EXPECT(g, ncclCommInitRank(&comm, NR, g->id, g->rank) == ncclSuccess, "init: %s", ncclGetLastError(NULL));
    EXPECT(g, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess, "stream");
    EXPECT(g, cudaMalloc((void **)&in, CNT * sizeof(float)) == cudaSuccess &&
                  cudaMalloc((void **)&red, CNT * sizeof(float)) == cudaSuccess &&
                  cudaMalloc((void **)&all, NR * CNT * sizeof(float)) == cudaSuccess &&
                  cudaMallocHost((void **)&pinned, CNT * sizeof(float)) == cudaSuccess,
           "memory");
    host = malloc(NR * CNT * sizeof(float));
    if (g->fail[0] || !host)
        return NULL;
    for (size_t i = 0; i < CNT; i++)
        pinned[i] = input(g->rank, 9, i); /* what a (wrong) run at capture would reduce */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    EXPECT(g, cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin capture");
    EXPECT(g, cudaMemcpyAsync(in, pinned, CNT * sizeof(float), cudaMemcpyHostToDevice, st) == cudaSuccess, "copy");
    EXPECT(g, ncclAllReduce(in, red, CNT, ncclFloat, ncclSum, comm, st) == ncclSuccess, "allreduce: %s",
           ncclGetLastError(comm));
    EXPECT(g, ncclAllGather(red, all, CNT, ncclFloat, comm, st) == ncclSuccess, "allgather: %s",
           ncclGetLastError(comm));
    EXPECT(g, cudaStreamEndCapture(st, &graph) == cudaSuccess, "end capture");
    EXPECT(g, cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
    EXPECT(g, cudaStreamSynchronize(st) == cudaSuccess, "sync after capture");
    EXPECT(g, cudaMemcpy(host, all, sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess, "copy back");
    EXPECT(g, host[0] != input(0, 9, 0) + input(1, 9, 0), "the captured collectives ran at capture time");
    for (int l = 0; l < LAUNCHES && !g->fail[0]; l++) {
        for (size_t i = 0; i < CNT; i++)
            pinned[i] = input(g->rank, l, i);
        EXPECT(g, cudaGraphLaunch(exec, st) == cudaSuccess, "launch %d", l);
        EXPECT(g, cudaStreamSynchronize(st) == cudaSuccess, "sync %d", l);
        EXPECT(g, cudaMemcpy(host, all, NR * CNT * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess, "copy back");
        for (size_t j = 0; j < NR * CNT && !g->fail[0]; j++) {
            size_t i = j % CNT;
            float want = input(0, l, i) + input(1, l, i);
            EXPECT(g, host[j] == want, "launch %d: element %zu is %g, expected %g", l, j, (double)host[j],
                   (double)want);
        }
    }
    ncclResult_t a = ncclInternalError;
    EXPECT(g, ncclCommGetAsyncError(comm, &a) == ncclSuccess && a == ncclSuccess, "async error %d", (int)a);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    EXPECT(g, ncclCommFinalize(comm) == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess, "finalize/destroy");
    free(host);
    cudaFreeHost(pinned);
    cudaStreamDestroy(st);
    return NULL;
}

static void test_graph_launches(void **state)
{
    (void)state;
    graph_rank g[NR];
    ncclUniqueId id;
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    pthread_t t[NR];
    for (int r = 0; r < NR; r++) {
        g[r] = (graph_rank){.rank = r, .id = id};
        assert_int_equal(pthread_create(&t[r], NULL, rank_main, &g[r]), 0);
    }
    for (int r = 0; r < NR; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < NR; r++)
        if (g[r].fail[0])
            fail_msg("rank %d: %s", r, g[r].fail);
    assert_int_equal(gm_violations(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_graph_launches)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
