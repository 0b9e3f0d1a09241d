/*
 * The NCCL model's injected faults and hang watchdog, one per run (the
 * environment is read once per process); CTest sets the variables:
 *   test_nccl_faults stop    GM_NCCL_FAULT=rank=1,after=2,kind=stop
 *       two collectives complete; at the third rank 1 never arrives, so both
 *       streams stay busy with no error reported, until rank 1 aborts: its
 *       own stream drains, rank 0's communicator reports ncclRemoteError and
 *       its collective waits until rank 0 aborts as well;
 *   test_nccl_faults async   GM_NCCL_FAULT=rank=0,after=1,kind=async
 *       after one collective rank 0's communicator reports ncclSystemError
 *       (rank 1's stays clean);
 *   test_nccl_faults hang    GM_NCCL_HANG_S=1
 *       rank 0 calls a collective rank 1 never calls: the model reports the
 *       hang and exits 3 (CTest matches the message) instead of hanging;
 *   test_nccl_faults deadpeer
 *       rank 1 is a child process that joins and exits: rank 0's collective
 *       sees its process gone (ncclRemoteError) and ends when rank 0 aborts.
 * Two thread-ranks driven by one host thread (ncclCommInitAll + groups),
 * except deadpeer (two processes; the child forks before any CUDA call).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <nccl.h>

#include "gm_model.h"

static ncclComm_t comm[2];
static cudaStream_t st[2];
static float *buf[2];

static int setup(void **state)
{
    (void)state;
    if (ncclCommInitAll(comm, 2, NULL) != ncclSuccess)
        return -1;
    for (int r = 0; r < 2; r++) {
        if (cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking) != cudaSuccess ||
            cudaMalloc((void **)&buf[r], 64 * sizeof(float)) != cudaSuccess)
            return -1;
        float h[64];
        for (int i = 0; i < 64; i++)
            h[i] = (float)(r + 1);
        if (cudaMemcpyAsync(buf[r], h, sizeof h, cudaMemcpyHostToDevice, st[r]) != cudaSuccess ||
            cudaStreamSynchronize(st[r]) != cudaSuccess)
            return -1;
    }
    return 0;
}

/* One all-reduce on both ranks (a group: one thread drives both). */
static void allreduce_both(void)
{
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; r++)
        assert_int_equal(ncclAllReduce(buf[r], buf[r], 64, ncclFloat, ncclSum, comm[r], st[r]), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
}

static ncclResult_t async_of(int r)
{
    ncclResult_t a = ncclInternalError;
    assert_int_equal(ncclCommGetAsyncError(comm[r], &a), ncclSuccess);
    return a;
}

static void expect_env(const char *name, const char *want)
{
    const char *v = getenv(name);
    if (!v || strcmp(v, want) != 0)
        fail_msg("%s must be \"%s\" for this test (it is \"%s\")", name, want, v ? v : "unset");
}

static void test_stop(void **state)
{
    (void)state;
    expect_env("GM_NCCL_FAULT", "rank=1,after=2,kind=stop");
    allreduce_both();
    allreduce_both();
    for (int r = 0; r < 2; r++) {
        assert_int_equal(cudaStreamSynchronize(st[r]), cudaSuccess);
        float h[64];
        assert_int_equal(cudaMemcpyAsync(h, buf[r], sizeof h, cudaMemcpyDeviceToHost, st[r]), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(st[r]), cudaSuccess);
        assert_true(h[7] == 6.0f); /* (1 + 2) then (3 + 3) */
    }
    allreduce_both(); /* rank 1's third never arrives */
    usleep(300000);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(cudaStreamQuery(st[r]), cudaErrorNotReady);
        assert_int_equal(async_of(r), ncclSuccess); /* a stopped peer looks like a slow one */
    }
    /* the stopped rank aborts (its own item exits); its peer sees it */
    assert_int_equal(ncclCommAbort(comm[1]), ncclSuccess);
    assert_int_equal(cudaStreamSynchronize(st[1]), cudaSuccess);
    ncclResult_t a = ncclSuccess;
    for (int i = 0; i < 2000 && (a = async_of(0)) != ncclRemoteError; i++)
        usleep(1000);
    assert_int_equal(a, ncclRemoteError);
    assert_non_null(strstr(ncclGetLastError(comm[0]), "rank 1 aborted"));
    assert_int_equal(cudaStreamQuery(st[0]), cudaErrorNotReady); /* until rank 0 aborts too */
    assert_int_equal(ncclCommAbort(comm[0]), ncclSuccess);
    assert_int_equal(cudaStreamSynchronize(st[0]), cudaSuccess);
}

static void test_async(void **state)
{
    (void)state;
    expect_env("GM_NCCL_FAULT", "rank=0,after=1,kind=async");
    assert_int_equal(async_of(0), ncclSuccess);
    allreduce_both();
    for (int r = 0; r < 2; r++)
        assert_int_equal(cudaStreamSynchronize(st[r]), cudaSuccess);
    assert_int_equal(async_of(0), ncclSystemError);
    assert_int_equal(async_of(1), ncclSuccess);
    assert_non_null(strstr(ncclGetLastError(comm[0]), "injected"));
    for (int r = 0; r < 2; r++)
        assert_int_equal(ncclCommAbort(comm[r]), ncclSuccess);
}

static void test_hang(void **state)
{
    (void)state;
    expect_env("GM_NCCL_HANG_S", "1");
    assert_int_equal(ncclAllReduce(buf[0], buf[0], 64, ncclFloat, ncclSum, comm[0], st[0]), ncclSuccess);
    cudaStreamSynchronize(st[0]); /* the model exits 3 from the stuck collective */
    fail_msg("a collective whose peer never came completed");
}

/* Rank 1 in a child that exits once joined; rank 0 here. */
static void test_deadpeer(void **state)
{
    (void)state;
    ncclUniqueId id;
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        ncclComm_t c = NULL;
        _exit(ncclCommInitRank(&c, 2, id, 1) == ncclSuccess ? 0 : 1);
    }
    ncclComm_t c = NULL;
    assert_int_equal(ncclCommInitRank(&c, 2, id, 0), ncclSuccess);
    int status = -1;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cudaStream_t s;
    float *d;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&d, 64 * sizeof(float)), cudaSuccess);
    assert_int_equal(ncclAllReduce(d, d, 64, ncclFloat, ncclSum, c, s), ncclSuccess);
    ncclResult_t a = ncclSuccess;
    for (int i = 0; i < 3000 && a != ncclRemoteError; i++) {
        assert_int_equal(ncclCommGetAsyncError(c, &a), ncclSuccess);
        usleep(1000);
    }
    assert_int_equal(a, ncclRemoteError);
    assert_non_null(strstr(ncclGetLastError(c), "exited"));
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    assert_int_equal(ncclCommAbort(c), ncclSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    cudaFree(d);
    cudaStreamDestroy(s);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    const struct CMUnitTest stop[] = {cmocka_unit_test_setup(test_stop, setup)};
    const struct CMUnitTest async[] = {cmocka_unit_test_setup(test_async, setup)};
    const struct CMUnitTest hang[] = {cmocka_unit_test_setup(test_hang, setup)};
    if (!strcmp(mode, "stop"))
        return cmocka_run_group_tests(stop, NULL, NULL);
    if (!strcmp(mode, "async"))
        return cmocka_run_group_tests(async, NULL, NULL);
    if (!strcmp(mode, "hang"))
        return cmocka_run_group_tests(hang, NULL, NULL);
    const struct CMUnitTest deadpeer[] = {cmocka_unit_test(test_deadpeer)};
    if (!strcmp(mode, "deadpeer"))
        return cmocka_run_group_tests(deadpeer, NULL, NULL);
    fprintf(stderr, "usage: test_nccl_faults stop|async|hang|deadpeer (with the environment CTest sets)\n");
    return 2;
}
