/*
 * Self-tests of the CPU model of NCCL (tests/gpumodel/nccl): thread-ranks
 * of one process, each its own communicator and streams, linked against the
 * model's libnccl.so.2 and the CUDA model. Expected values come from host
 * references computed here in double (inputs are small integers, so every
 * sum is exact in fp32 whatever the order) or written out by hand (the
 * 16-bit rounding cases), never from the model.
 *   - all-gather, reduce-scatter, all-reduce (sum, avg, max, min, prod),
 *     reduce, broadcast, all-to-all, gather, scatter on 4 ranks, out of
 *     place and in place (NCCL's
 *     in-place layouts, so rank r's offset is r * count), counts spanning
 *     several shared-memory rounds;
 *   - bf16 and fp16 sums rounded once (fp32 accumulation), uint8 wrap;
 *   - groups: nested, two communicators and two streams per rank, launched
 *     only at the outermost ncclGroupEnd, a failing member fails the group
 *     and launches nothing, calls forbidden inside a group;
 *   - ncclCommSplit into 2 x 2 (and keys reversing the order, NOCOLOR);
 *   - nonblocking creation, collectives and finalize (ncclInProgress until
 *     done, polled through ncclCommGetAsyncError);
 *   - ncclCommAbort releasing a peer blocked in a collective (ncclRemoteError)
 *     and its own blocked work;
 *   - NCCL's in-place rules and argument checks refused (violations counted);
 *   - mismatched collectives across ranks reported as an asynchronous error;
 *   - registration counted, unknown handles refused, ncclMemAlloc memory;
 *   - shared-memory files: none left once every communicator joined, and a
 *     crashed run's file removed by ncclGetUniqueId.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <nccl.h>

#include "gm_model.h"
#include "gm_nccl.h"

#define NR 4
#define MAXR 8

/* A thread-rank. Its device memory is one cudaMalloc carved by dev_alloc
 * and freed when the rank ends: cudaFree synchronizes the device, which on
 * one device shared by thread-ranks would wait for a peer's collective that
 * waits for this rank. */
typedef struct rank_ctx {
    int rank, n;
    void *shared;
    void (*fn)(struct rank_ctx *);
    char *pool;
    size_t used, cap;
    char fail[600];
} rank_ctx;

#define POOL_BYTES (8u << 20)

#define EXPECT(rc, cond, ...)                                           \
    do {                                                                \
        if (!(cond) && !(rc)->fail[0]) {                                \
            int n_ = snprintf((rc)->fail, sizeof(rc)->fail, "line %d: ", __LINE__); \
            snprintf((rc)->fail + n_, sizeof(rc)->fail - (size_t)n_, __VA_ARGS__); \
        }                                                               \
    } while (0)
#define EXPECT_OK(rc, call) EXPECT(rc, (call) == ncclSuccess, "%s failed: %s", #call, ncclGetLastError(NULL))
#define EXPECT_CUDA(rc, call) EXPECT(rc, (call) == cudaSuccess, "%s failed", #call)

static void *thread_main(void *arg)
{
    rank_ctx *rc = arg;
    if (cudaMalloc((void **)&rc->pool, POOL_BYTES) != cudaSuccess) {
        snprintf(rc->fail, sizeof rc->fail, "cudaMalloc of the rank's pool failed");
        return NULL;
    }
    rc->cap = POOL_BYTES;
    rc->fn(rc);
    cudaFree(rc->pool);
    return NULL;
}

static void run_ranks(int n, void (*fn)(rank_ctx *), void *shared)
{
    pthread_t t[MAXR];
    rank_ctx rc[MAXR];
    for (int r = 0; r < n; r++) {
        rc[r] = (rank_ctx){.rank = r, .n = n, .shared = shared, .fn = fn};
        assert_int_equal(pthread_create(&t[r], NULL, thread_main, &rc[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < n; r++)
        if (rc[r].fail[0])
            fail_msg("rank %d: %s", r, rc[r].fail);
}

static void *dev_alloc(rank_ctx *rc, size_t bytes)
{
    size_t at = (rc->used + 255) / 256 * 256;
    EXPECT(rc, at + bytes <= rc->cap, "the rank's pool of %zu bytes is too small", rc->cap);
    if (at + bytes > rc->cap)
        at = 0;
    rc->used = at + bytes;
    return rc->pool + at;
}

/* Releases everything carved since `mark` (rc->used before). */
static void dev_release(rank_ctx *rc, size_t mark)
{
    rc->used = mark;
}

/* Copies on the rank's own stream and waits: a cudaMemcpy would run on the
 * legacy stream, which nothing orders with the non-blocking streams of the
 * collectives (and a pageable upload may complete after it returns). */
static void upload(void *d, const void *h, size_t bytes, cudaStream_t st)
{
    if (cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess)
        fprintf(stderr, "test_nccl_model: upload of %zu bytes failed\n", bytes);
}

static void download(void *h, const void *d, size_t bytes, cudaStream_t st)
{
    if (cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess)
        fprintf(stderr, "test_nccl_model: download of %zu bytes failed\n", bytes);
}

static float val(int r, size_t i)
{
    return (float)((r + 1) * 1000 + (int)(i % 997));
}

static float pval(int r, size_t i)
{
    return (float)(1 + (r + (int)i) % 3);
}

typedef struct coll_shared {
    ncclUniqueId id;
} coll_shared;

/* ---- collectives vs host references ---- */

#define CNT 50000u   /* all-reduce / reduce / broadcast elements: 2 rounds */
#define PER 20000u   /* all-gather sendcount, reduce-scatter recvcount: 3+ rounds on 4 ranks */

static void check_allreduce(rank_ctx *rc, ncclComm_t comm, cudaStream_t st, bool inplace, ncclRedOp_t op)
{
    size_t mark = rc->used;
    float *h = malloc(CNT * sizeof *h);
    float *s = dev_alloc(rc, CNT * sizeof(float)), *d = inplace ? s : dev_alloc(rc, CNT * sizeof(float));
    for (size_t i = 0; i < CNT; i++)
        h[i] = op == ncclProd ? pval(rc->rank, i) : val(rc->rank, i);
    upload(s, h, CNT * sizeof *h, st);
    EXPECT_OK(rc, ncclAllReduce(s, d, CNT, ncclFloat, op, comm, st));
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    download(h, d, CNT * sizeof *h, st);
    for (size_t i = 0; i < CNT && !rc->fail[0]; i++) {
        double acc = op == ncclProd ? 1 : op == ncclMax ? -1e30 : op == ncclMin ? 1e30 : 0;
        for (int q = 0; q < rc->n; q++) {
            double v = op == ncclProd ? pval(q, i) : val(q, i);
            acc = op == ncclProd ? acc * v : op == ncclMax ? (v > acc ? v : acc) : op == ncclMin ? (v < acc ? v : acc)
                                                                                                : acc + v;
        }
        if (op == ncclAvg)
            acc /= rc->n;
        EXPECT(rc, h[i] == (float)acc, "allreduce op %d inplace %d: element %zu is %g, expected %g", (int)op,
               (int)inplace, i, (double)h[i], acc);
    }
    dev_release(rc, mark);
    free(h);
}

static void check_allgather(rank_ctx *rc, ncclComm_t comm, cudaStream_t st, bool inplace)
{
    size_t mark = rc->used;
    size_t n = (size_t)rc->n;
    float *h = malloc(n * PER * sizeof *h);
    float *d = dev_alloc(rc, n * PER * sizeof(float));
    float *s = inplace ? d + (size_t)rc->rank * PER : dev_alloc(rc, PER * sizeof(float));
    for (size_t i = 0; i < PER; i++)
        h[i] = val(rc->rank, i);
    upload(s, h, PER * sizeof *h, st);
    EXPECT_OK(rc, ncclAllGather(s, d, PER, ncclFloat, comm, st));
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    download(h, d, n * PER * sizeof *h, st);
    for (size_t q = 0; q < n; q++)
        for (size_t i = 0; i < PER && !rc->fail[0]; i++)
            EXPECT(rc, h[q * PER + i] == val((int)q, i), "allgather inplace %d: block %zu element %zu is %g, expected %g",
                   (int)inplace, q, i, (double)h[q * PER + i], (double)val((int)q, i));
    dev_release(rc, mark);
    free(h);
}

static void check_reducescatter(rank_ctx *rc, ncclComm_t comm, cudaStream_t st, bool inplace)
{
    size_t mark = rc->used;
    size_t n = (size_t)rc->n, me = (size_t)rc->rank;
    float *h = malloc(n * PER * sizeof *h);
    float *s = dev_alloc(rc, n * PER * sizeof(float));
    float *d = inplace ? s + me * PER : dev_alloc(rc, PER * sizeof(float));
    for (size_t j = 0; j < n * PER; j++)
        h[j] = val(rc->rank, j);
    upload(s, h, n * PER * sizeof *h, st);
    EXPECT_OK(rc, ncclReduceScatter(s, d, PER, ncclFloat, ncclSum, comm, st));
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    download(h, d, PER * sizeof *h, st);
    for (size_t i = 0; i < PER && !rc->fail[0]; i++) {
        double acc = 0;
        for (int q = 0; q < rc->n; q++)
            acc += val(q, me * PER + i);
        EXPECT(rc, h[i] == (float)acc, "reducescatter inplace %d: element %zu is %g, expected %g", (int)inplace, i,
               (double)h[i], acc);
    }
    dev_release(rc, mark);
    free(h);
}

static void check_rooted(rank_ctx *rc, ncclComm_t comm, cudaStream_t st, bool inplace)
{
    size_t mark = rc->used;
    const int rroot = 2 % rc->n, broot = 1 % rc->n;
    float *h = malloc(CNT * sizeof *h);
    float *s = dev_alloc(rc, CNT * sizeof(float)), *d = inplace ? s : dev_alloc(rc, CNT * sizeof(float));
    for (size_t i = 0; i < CNT; i++)
        h[i] = -1;
    if (!inplace)
        upload(d, h, CNT * sizeof *h, st);
    for (size_t i = 0; i < CNT; i++)
        h[i] = val(rc->rank, i);
    upload(s, h, CNT * sizeof *h, st);
    EXPECT_OK(rc, ncclReduce(s, d, CNT, ncclFloat, ncclSum, rroot, comm, st));
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    download(h, d, CNT * sizeof *h, st);
    for (size_t i = 0; i < CNT && !rc->fail[0]; i++) {
        double acc = 0;
        for (int q = 0; q < rc->n; q++)
            acc += val(q, i);
        float want = rc->rank == rroot ? (float)acc : inplace ? val(rc->rank, i) : -1.0f;
        EXPECT(rc, h[i] == want, "reduce to %d inplace %d: element %zu is %g, expected %g", rroot, (int)inplace, i,
               (double)h[i], (double)want);
    }
    for (size_t i = 0; i < CNT; i++)
        h[i] = val(rc->rank, i);
    upload(s, h, CNT * sizeof *h, st);
    EXPECT_OK(rc, ncclBroadcast(s, d, CNT, ncclFloat, broot, comm, st));
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    download(h, d, CNT * sizeof *h, st);
    for (size_t i = 0; i < CNT && !rc->fail[0]; i++)
        EXPECT(rc, h[i] == val(broot, i), "broadcast from %d inplace %d: element %zu is %g, expected %g", broot,
               (int)inplace, i, (double)h[i], (double)val(broot, i));
    dev_release(rc, mark);
    free(h);
}

/* all-to-all (out of place: it has no in-place form), gather to the last
 * rank and scatter from rank 0 (in place at the root or not) */
static void check_alltoall_gather_scatter(rank_ctx *rc, ncclComm_t comm, cudaStream_t st, bool inplace)
{
    size_t mark = rc->used, n = (size_t)rc->n, me = (size_t)rc->rank;
    int groot = rc->n - 1, sroot = 0;
    float *h = malloc(n * PER * sizeof *h);
    float *a = dev_alloc(rc, n * PER * sizeof(float)), *b = dev_alloc(rc, n * PER * sizeof(float));
    for (size_t j = 0; j < n * PER; j++)
        h[j] = val(rc->rank, j);
    upload(a, h, n * PER * sizeof *h, st);
    if (!inplace) {
        EXPECT_OK(rc, ncclAlltoAll(a, b, PER, ncclFloat, comm, st));
        download(h, b, n * PER * sizeof *h, st);
        for (size_t j = 0; j < n * PER && !rc->fail[0]; j++)
            EXPECT(rc, h[j] == val((int)(j / PER), me * PER + j % PER), "alltoall element %zu is %g, expected %g", j,
                   (double)h[j], (double)val((int)(j / PER), me * PER + j % PER));
    }
    /* gather: b holds n blocks at the root; in place the root's block is its send */
    for (size_t j = 0; j < n * PER; j++)
        h[j] = -1;
    upload(b, h, n * PER * sizeof *h, st);
    for (size_t i = 0; i < PER; i++)
        h[i] = val(rc->rank, i);
    float *gs = inplace && rc->rank == groot ? b + (size_t)groot * PER : a;
    upload(gs, h, PER * sizeof *h, st);
    EXPECT_OK(rc, ncclGather(gs, b, PER, ncclFloat, groot, comm, st));
    download(h, b, n * PER * sizeof *h, st);
    for (size_t j = 0; j < n * PER && !rc->fail[0]; j++) {
        float want = rc->rank == groot ? val((int)(j / PER), j % PER) : -1.0f;
        EXPECT(rc, h[j] == want, "gather to %d inplace %d: element %zu is %g, expected %g", groot, (int)inplace, j,
               (double)h[j], (double)want);
    }
    /* scatter: the root's a holds n blocks; in place the root receives in its own */
    for (size_t j = 0; j < n * PER; j++)
        h[j] = val(rc->rank, j);
    upload(a, h, n * PER * sizeof *h, st);
    float *sr = inplace && rc->rank == sroot ? a + (size_t)sroot * PER : b;
    EXPECT_OK(rc, ncclScatter(a, sr, PER, ncclFloat, sroot, comm, st));
    download(h, sr, PER * sizeof *h, st);
    for (size_t i = 0; i < PER && !rc->fail[0]; i++)
        EXPECT(rc, h[i] == val(sroot, me * PER + i), "scatter from %d inplace %d: element %zu is %g, expected %g",
               sroot, (int)inplace, i, (double)h[i], (double)val(sroot, me * PER + i));
    dev_release(rc, mark);
    free(h);
}

static void coll_rank(rank_ctx *rc)
{
    coll_shared *sh = rc->shared;
    ncclComm_t comm = NULL;
    EXPECT_OK(rc, ncclCommInitRank(&comm, rc->n, sh->id, rc->rank));
    if (!comm)
        return;
    int n = 0, me = -1;
    EXPECT_OK(rc, ncclCommCount(comm, &n));
    EXPECT_OK(rc, ncclCommUserRank(comm, &me));
    EXPECT(rc, n == rc->n && me == rc->rank, "count %d rank %d", n, me);
    cudaStream_t st;
    EXPECT_CUDA(rc, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int inplace = 0; inplace < 2; inplace++) {
        static const ncclRedOp_t ops[] = {ncclSum, ncclAvg, ncclMax, ncclMin, ncclProd};
        for (int k = 0; k < 5; k++)
            check_allreduce(rc, comm, st, inplace, ops[k]);
        check_allgather(rc, comm, st, inplace);
        check_reducescatter(rc, comm, st, inplace);
        check_rooted(rc, comm, st, inplace);
        check_alltoall_gather_scatter(rc, comm, st, inplace);
    }
    EXPECT_OK(rc, ncclCommFinalize(comm));
    EXPECT_OK(rc, ncclCommDestroy(comm));
    cudaStreamDestroy(st);
}

static void test_collectives(void **state)
{
    (void)state;
    coll_shared sh;
    assert_int_equal(ncclGetUniqueId(&sh.id), ncclSuccess);
    run_ranks(NR, coll_rank, &sh);
    assert_int_equal(gm_violations(), 0);
}

/* ---- 16-bit rounding, integer wrap ---- */

/* The inputs per rank (bits) and the expected result, by hand: bf16
 * 1 + 2^-8 + 2^-8 + 2^-9 = 1 + 2^-7 + 2^-9 in fp32 rounds once to 1 + 2^-7
 * (0x3f81); adding rank by rank in bf16 would tie to even at 1 + 2^-8 and
 * give 1.0 (0x3f80). avg: (1 + 2^-7 + 2^-9) / 4 -> 0.25 + 2^-9 (0x3e81).
 * fp16: 1 + 2^-11 + 2^-11 + 2^-12 -> 1 + 2^-10 (0x3c01), not 0x3c00. */
static const uint16_t bf16_in[NR] = {0x3f80, 0x3b80, 0x3b80, 0x3b00};
static const uint16_t fp16_in[NR] = {0x3c00, 0x1000, 0x1000, 0x0c00};

static void round_rank(rank_ctx *rc)
{
    coll_shared *sh = rc->shared;
    ncclComm_t comm = NULL;
    EXPECT_OK(rc, ncclCommInitRank(&comm, rc->n, sh->id, rc->rank));
    if (!comm)
        return;
    cudaStream_t st;
    EXPECT_CUDA(rc, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint16_t *d = dev_alloc(rc, 64 * sizeof(uint16_t)), h[64];
    struct { ncclDataType_t t; ncclRedOp_t op; const uint16_t *in; uint16_t want; } cases[] = {
        {ncclBfloat16, ncclSum, bf16_in, 0x3f81},
        {ncclBfloat16, ncclAvg, bf16_in, 0x3e81},
        {ncclFloat16, ncclSum, fp16_in, 0x3c01},
    };
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < 64; i++)
            h[i] = cases[c].in[rc->rank];
        upload(d, h, sizeof h, st);
        EXPECT_OK(rc, ncclAllReduce(d, d, 64, cases[c].t, cases[c].op, comm, st));
        EXPECT_CUDA(rc, cudaStreamSynchronize(st));
        download(h, d, sizeof h, st);
        for (int i = 0; i < 64; i++)
            EXPECT(rc, h[i] == cases[c].want, "case %d: element %d is 0x%04x, expected 0x%04x", c, i, h[i],
                   cases[c].want);
    }
    uint8_t *b = (uint8_t *)d, hb[16];
    memset(hb, 200 + rc->rank, sizeof hb);
    upload(b, hb, sizeof hb, st);
    EXPECT_OK(rc, ncclAllReduce(b, b, 16, ncclUint8, ncclSum, comm, st));
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    download(hb, b, sizeof hb, st);
    EXPECT(rc, hb[5] == (uint8_t)(200 * 4 + 0 + 1 + 2 + 3), "uint8 sum is %u, expected %u (mod 256)", hb[5],
           (unsigned)(uint8_t)(806));
    EXPECT_OK(rc, ncclCommDestroy(comm));
    cudaStreamDestroy(st);
}

static void test_rounding(void **state)
{
    (void)state;
    coll_shared sh;
    assert_int_equal(ncclGetUniqueId(&sh.id), ncclSuccess);
    run_ranks(NR, round_rank, &sh);
}

/* ---- groups ---- */

typedef struct group_shared {
    ncclUniqueId a, b;
} group_shared;

static void group_rank(rank_ctx *rc)
{
    group_shared *sh = rc->shared;
    ncclComm_t ca = NULL, cb = NULL;
    /* both creations in one group: the group ends when both joined */
    EXPECT_OK(rc, ncclGroupStart());
    EXPECT_OK(rc, ncclCommInitRank(&ca, rc->n, sh->a, rc->rank));
    EXPECT_OK(rc, ncclCommInitRank(&cb, rc->n, sh->b, rc->rank));
    EXPECT_OK(rc, ncclGroupEnd());
    if (!ca || !cb)
        return;
    cudaStream_t sa, sb;
    EXPECT_CUDA(rc, cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    EXPECT_CUDA(rc, cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    size_t n = (size_t)rc->n;
    float *x = dev_alloc(rc, PER * sizeof(float)), *y = dev_alloc(rc, n * PER * sizeof(float));
    float *z = dev_alloc(rc, PER * sizeof(float)); /* the streams run concurrently: no shared buffer */
    float *h = malloc(n * PER * sizeof *h);
    for (size_t i = 0; i < PER; i++)
        h[i] = val(rc->rank, i);
    upload(x, h, PER * sizeof *h, sa);
    upload(z, h, PER * sizeof *h, sa);
    EXPECT_OK(rc, ncclGroupStart());
    EXPECT_OK(rc, ncclAllGather(x, y, PER, ncclFloat, cb, sb));
    EXPECT_OK(rc, ncclGroupStart());
    EXPECT_OK(rc, ncclAllReduce(z, z, PER, ncclFloat, ncclMax, ca, sa));
    EXPECT_OK(rc, ncclGroupEnd());
    EXPECT(rc, ncclCommDestroy(ca) == ncclInvalidUsage, "ncclCommDestroy inside a group was accepted");
    EXPECT_OK(rc, ncclGroupEnd());
    EXPECT_CUDA(rc, cudaStreamSynchronize(sa));
    EXPECT_CUDA(rc, cudaStreamSynchronize(sb));
    download(h, y, n * PER * sizeof *h, sa);
    for (size_t q = 0; q < n; q++)
        for (size_t i = 0; i < PER; i += 97)
            EXPECT(rc, h[q * PER + i] == val((int)q, i), "group allgather block %zu element %zu is %g", q, i,
                   (double)h[q * PER + i]);
    download(h, z, PER * sizeof *h, sa);
    for (size_t i = 0; i < PER; i += 97)
        EXPECT(rc, h[i] == val(rc->n - 1, i), "group allreduce max element %zu is %g, expected %g", i, (double)h[i],
               (double)val(rc->n - 1, i));
    free(h);
    EXPECT_OK(rc, ncclCommDestroy(ca));
    EXPECT_OK(rc, ncclCommDestroy(cb));
    cudaStreamDestroy(sa);
    cudaStreamDestroy(sb);
}

static void test_groups_two_comms(void **state)
{
    (void)state;
    group_shared sh;
    assert_int_equal(ncclGetUniqueId(&sh.a), ncclSuccess);
    assert_int_equal(ncclGetUniqueId(&sh.b), ncclSuccess);
    run_ranks(NR, group_rank, &sh);
}

/* One host thread drives 4 communicators (ncclCommInitAll): only a group
 * lets it; the collectives launch at the outermost ncclGroupEnd, and a group
 * with a failing member launches none. */
static void test_group_one_thread(void **state)
{
    (void)state;
    ncclComm_t c[NR];
    cudaStream_t st[NR];
    float *buf[NR];
    assert_int_equal(ncclCommInitAll(c, NR, NULL), ncclSuccess);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&buf[r], 256 * sizeof(float)), cudaSuccess);
        float h[256];
        for (int i = 0; i < 256; i++)
            h[i] = val(r, (size_t)i);
        upload(buf[r], h, sizeof h, st[r]);
    }
    gm_nccl_counters before, mid, after;
    gm_nccl_stats(&before);
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < NR; r++)
        assert_int_equal(ncclAllReduce(buf[r], buf[r], 256, ncclFloat, ncclSum, c[r], st[r]), ncclSuccess);
    gm_nccl_stats(&mid);
    assert_int_equal(mid.collectives, before.collectives); /* deferred */
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    gm_nccl_stats(&after);
    assert_int_equal(after.collectives, before.collectives + NR);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(cudaStreamSynchronize(st[r]), cudaSuccess);
        float h[256];
        download(h, buf[r], sizeof h, st[r]);
        for (int i = 0; i < 256; i++)
            assert_true(h[i] == val(0, (size_t)i) + val(1, (size_t)i) + val(2, (size_t)i) + val(3, (size_t)i));
    }
    /* a member with a bad root fails at its call and at ncclGroupEnd; nothing launches */
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclAllReduce(buf[0], buf[0], 256, ncclFloat, ncclSum, c[0], st[0]), ncclSuccess);
    assert_int_equal(ncclBroadcast(buf[1], buf[1], 256, ncclFloat, NR, c[1], st[1]), ncclInvalidArgument);
    assert_non_null(strstr(ncclGetLastError(NULL), "root"));
    assert_int_equal(ncclGroupEnd(), ncclInvalidArgument);
    gm_nccl_stats(&mid);
    assert_int_equal(mid.collectives, after.collectives);
    assert_int_equal(ncclGroupEnd(), ncclInvalidUsage); /* no group open */
    for (int r = 0; r < NR; r++) {
        assert_int_equal(ncclCommDestroy(c[r]), ncclSuccess);
        cudaFree(buf[r]);
        cudaStreamDestroy(st[r]);
    }
}

/* ---- split ---- */

static void split_rank(rank_ctx *rc)
{
    coll_shared *sh = rc->shared;
    ncclComm_t world = NULL, row = NULL, col = NULL, some = NULL;
    EXPECT_OK(rc, ncclCommInitRank(&world, rc->n, sh->id, rc->rank));
    if (!world)
        return;
    int r = rc->rank;
    EXPECT_OK(rc, ncclCommSplit(world, r / 2, r % 2, &row, NULL));
    EXPECT_OK(rc, ncclCommSplit(world, r % 2, -r, &col, NULL)); /* keys reverse the order */
    EXPECT_OK(rc, ncclCommSplit(world, r == 3 ? NCCL_SPLIT_NOCOLOR : 0, 0, &some, NULL));
    if (!row || !col)
        return;
    int n = 0, me = -1;
    EXPECT_OK(rc, ncclCommCount(row, &n));
    EXPECT_OK(rc, ncclCommUserRank(row, &me));
    EXPECT(rc, n == 2 && me == r % 2, "row: count %d rank %d", n, me);
    EXPECT_OK(rc, ncclCommCount(col, &n));
    EXPECT_OK(rc, ncclCommUserRank(col, &me));
    EXPECT(rc, n == 2 && me == 1 - r / 2, "col: count %d rank %d, expected 2 and %d", n, me, 1 - r / 2);
    EXPECT(rc, (r == 3) == (some == NULL), "NOCOLOR: comm %p on rank %d", (void *)some, r);
    if (some) {
        EXPECT_OK(rc, ncclCommCount(some, &n));
        EXPECT(rc, n == 3, "3 of 4 colored: count %d", n);
    }
    cudaStream_t st;
    EXPECT_CUDA(rc, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *d = dev_alloc(rc, 1000 * sizeof(float)), h[1000];
    for (int i = 0; i < 1000; i++)
        h[i] = val(r, (size_t)i);
    upload(d, h, sizeof h, st);
    EXPECT_OK(rc, ncclAllReduce(d, d, 1000, ncclFloat, ncclSum, row, st));
    EXPECT_OK(rc, ncclAllReduce(d, d, 1000, ncclFloat, ncclSum, col, st));
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    download(h, d, sizeof h, st);
    for (int i = 0; i < 1000; i += 7) /* rows then columns: the sum over all 4 */
        EXPECT(rc, h[i] == val(0, (size_t)i) + val(1, (size_t)i) + val(2, (size_t)i) + val(3, (size_t)i),
               "split 2x2 element %d is %g", i, (double)h[i]);
    EXPECT_OK(rc, ncclCommDestroy(row));
    EXPECT_OK(rc, ncclCommDestroy(col));
    if (some)
        EXPECT_OK(rc, ncclCommDestroy(some));
    EXPECT_OK(rc, ncclCommDestroy(world));
    cudaStreamDestroy(st);
}

static void test_split(void **state)
{
    (void)state;
    coll_shared sh;
    assert_int_equal(ncclGetUniqueId(&sh.id), ncclSuccess);
    run_ranks(NR, split_rank, &sh);
}

/* ---- nonblocking ---- */

static ncclResult_t settle(ncclComm_t comm, int *polls)
{
    ncclResult_t st = ncclInProgress;
    for (*polls = 0; st == ncclInProgress && *polls < 200000; (*polls)++) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess)
            return ncclInternalError;
        if (st == ncclInProgress)
            usleep(100);
    }
    return st;
}

typedef struct nb_shared {
    ncclUniqueId id;
    ncclComm_t comm0;   /* rank 0's, created by the main thread */
} nb_shared;

static void nb_rank(rank_ctx *rc)
{
    nb_shared *sh = rc->shared;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "nb";
    ncclComm_t comm = sh->comm0;
    int polls = 0;
    if (rc->rank != 0)
        EXPECT(rc, ncclCommInitRankConfig(&comm, rc->n, sh->id, rc->rank, &cfg) == ncclInProgress,
               "nonblocking init did not return ncclInProgress");
    EXPECT(rc, settle(comm, &polls) == ncclSuccess, "nonblocking init did not settle");
    cudaStream_t st;
    EXPECT_CUDA(rc, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *d = dev_alloc(rc, 100 * sizeof(float)), h[100];
    for (int i = 0; i < 100; i++)
        h[i] = val(rc->rank, (size_t)i);
    upload(d, h, sizeof h, st);
    ncclResult_t r = ncclAllReduce(d, d, 100, ncclFloat, ncclSum, comm, st);
    EXPECT(rc, r == ncclInProgress || r == ncclSuccess, "nonblocking allreduce: %s", ncclGetErrorString(r));
    EXPECT(rc, settle(comm, &polls) == ncclSuccess, "nonblocking allreduce did not settle");
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    download(h, d, sizeof h, st);
    EXPECT(rc, h[9] == val(0, 9) + val(1, 9) + val(2, 9) + val(3, 9), "nonblocking allreduce gave %g", (double)h[9]);
    EXPECT(rc, ncclCommFinalize(comm) == ncclInProgress, "nonblocking finalize did not return ncclInProgress");
    EXPECT(rc, settle(comm, &polls) == ncclSuccess, "nonblocking finalize did not settle");
    EXPECT_OK(rc, ncclCommDestroy(comm));
    cudaStreamDestroy(st);
}

static void test_nonblocking(void **state)
{
    (void)state;
    nb_shared sh;
    assert_int_equal(ncclGetUniqueId(&sh.id), ncclSuccess);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    assert_int_equal(ncclCommInitRankConfig(&sh.comm0, NR, sh.id, 0, &cfg), ncclInProgress);
    assert_non_null(sh.comm0);
    usleep(50000);
    ncclResult_t st = ncclSuccess;
    assert_int_equal(ncclCommGetAsyncError(sh.comm0, &st), ncclSuccess);
    assert_int_equal(st, ncclInProgress); /* the other ranks have not come */
    int n = 0;
    assert_int_equal(ncclCommCount(sh.comm0, &n), ncclInvalidUsage); /* not ready yet */
    run_ranks(NR, nb_rank, &sh);
    /* a config not made with NCCL_CONFIG_INITIALIZER is refused */
    ncclConfig_t bad;
    memset(&bad, 0, sizeof bad);
    ncclComm_t c = NULL;
    assert_int_equal(ncclCommInitRankConfig(&c, 1, sh.id, 0, &bad), ncclInvalidArgument);
}

/* ---- abort ---- */

typedef struct abort_shared {
    ncclUniqueId id;
    ncclComm_t comm[2];
    cudaStream_t st[2];
    float *buf[2];
} abort_shared;

static void abort_init(rank_ctx *rc)
{
    abort_shared *sh = rc->shared;
    EXPECT_OK(rc, ncclCommInitRank(&sh->comm[rc->rank], rc->n, sh->id, rc->rank));
    EXPECT_CUDA(rc, cudaStreamCreateWithFlags(&sh->st[rc->rank], cudaStreamNonBlocking));
}

/* Polls comm's asynchronous error for up to 2 s until it is `want`; returns
 * the last one seen. */
static ncclResult_t poll_async(ncclComm_t comm, ncclResult_t want)
{
    ncclResult_t st = ncclInternalError;
    for (int i = 0; i < 2000; i++) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess)
            return ncclInternalError;
        if (st == want)
            break;
        usleep(1000);
    }
    return st;
}

static void test_abort_releases_peer(void **state)
{
    (void)state;
    abort_shared sh;
    memset(&sh, 0, sizeof sh);
    assert_int_equal(ncclGetUniqueId(&sh.id), ncclSuccess);
    run_ranks(2, abort_init, &sh);
    for (int r = 0; r < 2; r++)
        assert_int_equal(cudaMalloc((void **)&sh.buf[r], 64 * sizeof(float)), cudaSuccess);
    /* rank 0 enters a collective rank 1 never calls: its stream blocks */
    assert_int_equal(ncclAllReduce(sh.buf[0], sh.buf[0], 64, ncclFloat, ncclSum, sh.comm[0], sh.st[0]), ncclSuccess);
    usleep(200000);
    assert_int_equal(cudaStreamQuery(sh.st[0]), cudaErrorNotReady);
    assert_int_equal(poll_async(sh.comm[0], ncclSuccess), ncclSuccess); /* a slow peer is no error */
    /* rank 1 aborts: rank 0's comm reports the peer (ncclRemoteError), but
     * its collective, like NCCL's kernels, waits until rank 0 aborts too */
    assert_int_equal(ncclCommAbort(sh.comm[1]), ncclSuccess);
    assert_int_equal(poll_async(sh.comm[0], ncclRemoteError), ncclRemoteError);
    assert_non_null(strstr(ncclGetLastError(sh.comm[0]), "rank 1 aborted"));
    /* a later collective on the broken comm waits as well */
    assert_int_equal(ncclAllReduce(sh.buf[0], sh.buf[0], 64, ncclFloat, ncclSum, sh.comm[0], sh.st[0]), ncclSuccess);
    usleep(100000);
    assert_int_equal(cudaStreamQuery(sh.st[0]), cudaErrorNotReady);
    assert_int_equal(ncclCommFinalize(sh.comm[0]), ncclRemoteError); /* broken: abort it */
    assert_int_equal(ncclCommAbort(sh.comm[0]), ncclSuccess);
    assert_int_equal(cudaStreamSynchronize(sh.st[0]), cudaSuccess); /* both items exited */
    ncclResult_t st = ncclSuccess;
    assert_int_equal(ncclCommGetAsyncError(sh.comm[0], &st), ncclInvalidArgument); /* gone */
    gm_nccl_counters c;
    gm_nccl_stats(&c);
    assert_true(c.aborts >= 2);
    for (int r = 0; r < 2; r++) {
        cudaFree(sh.buf[r]);
        cudaStreamDestroy(sh.st[r]);
    }
}

static void test_abort_own_blocked_work(void **state)
{
    (void)state;
    abort_shared sh;
    memset(&sh, 0, sizeof sh);
    assert_int_equal(ncclGetUniqueId(&sh.id), ncclSuccess);
    run_ranks(2, abort_init, &sh);
    for (int r = 0; r < 2; r++)
        assert_int_equal(cudaMalloc((void **)&sh.buf[r], 64 * sizeof(float)), cudaSuccess);
    assert_int_equal(ncclBroadcast(sh.buf[1], sh.buf[1], 64, ncclFloat, 0, sh.comm[1], sh.st[1]), ncclSuccess);
    usleep(100000);
    assert_int_equal(cudaStreamQuery(sh.st[1]), cudaErrorNotReady);
    assert_int_equal(ncclCommAbort(sh.comm[1]), ncclSuccess); /* its own blocked item exits */
    assert_int_equal(cudaStreamSynchronize(sh.st[1]), cudaSuccess);
    assert_int_equal(ncclCommAbort(sh.comm[0]), ncclSuccess);
    for (int r = 0; r < 2; r++) {
        cudaFree(sh.buf[r]);
        cudaStreamDestroy(sh.st[r]);
    }
}

/* ---- rules ---- */

static void test_inplace_rules(void **state)
{
    (void)state;
    ncclComm_t c[2];
    assert_int_equal(ncclCommInitAll(c, 2, NULL), ncclSuccess);
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    float *d;
    assert_int_equal(cudaMalloc((void **)&d, 4096 * sizeof(float)), cudaSuccess);
    gm_violations_reset();
    /* rank 1's in-place all-gather must send from recvbuff + 1 * count: +0 overlaps */
    assert_int_equal(ncclAllGather(d, d, 100, ncclFloat, c[1], st), ncclInvalidArgument);
    assert_int_equal(gm_violations(), 1);
    /* reduce-scatter: recvbuff must be sendbuff + rank * recvcount */
    assert_int_equal(ncclReduceScatter(d, d + 50, 100, ncclFloat, ncclSum, c[1], st), ncclInvalidArgument);
    assert_int_equal(gm_violations(), 2);
    assert_non_null(strstr(ncclGetLastError(c[1]), "in place"));
    /* all-reduce: partial overlap */
    assert_int_equal(ncclAllReduce(d, d + 1, 100, ncclFloat, ncclSum, c[0], st), ncclInvalidArgument);
    assert_int_equal(gm_violations(), 3);
    /* all-to-all has no in-place form */
    assert_int_equal(ncclAlltoAll(d, d, 100, ncclFloat, c[0], st), ncclInvalidArgument);
    assert_int_equal(gm_violations(), 4);
    gm_violations_reset();
    assert_int_equal(ncclSend(d, 10, ncclFloat, 1, c[0], st), ncclInvalidUsage); /* not modelled: said so */
    assert_non_null(strstr(ncclGetLastError(NULL), "not modelled"));
    assert_int_equal(gm_violations(), 1);
    gm_violations_reset();
    /* out of the allocation */
    assert_int_equal(ncclAllReduce(d, d + 2048, 4000, ncclFloat, ncclSum, c[0], st), ncclInvalidArgument);
    assert_int_equal(gm_violations(), 1);
    gm_violations_reset();
    /* argument checks without a violation: type, op, root, NULL */
    assert_int_equal(ncclAllReduce(d, d, 10, (ncclDataType_t)99, ncclSum, c[0], st), ncclInvalidArgument);
    assert_int_equal(ncclAllReduce(d, d, 10, ncclFloat8e4m3, ncclSum, c[0], st), ncclInvalidArgument);
    assert_int_equal(ncclAllReduce(d, d, 10, ncclFloat, (ncclRedOp_t)7, c[0], st), ncclInvalidArgument);
    assert_int_equal(ncclReduce(d, d, 10, ncclFloat, ncclSum, -1, c[0], st), ncclInvalidArgument);
    assert_int_equal(ncclAllReduce(NULL, d, 10, ncclFloat, ncclSum, c[0], st), ncclInvalidArgument);
    assert_int_equal(ncclAllReduce(d, d, 10, ncclFloat, ncclSum, NULL, st), ncclInvalidArgument);
    assert_int_equal(gm_violations(), 0);
    /* the in-place layouts themselves are accepted: rank 0 sends from +0,
     * rank 1 from +count (its own buffer: both ranks live in this process) */
    float *e, h[200];
    assert_int_equal(cudaMalloc((void **)&e, 200 * sizeof(float)), cudaSuccess);
    for (int i = 0; i < 200; i++)
        h[i] = i < 100 ? 1.0f : 2.0f;
    cudaStream_t st1;
    assert_int_equal(cudaStreamCreateWithFlags(&st1, cudaStreamNonBlocking), cudaSuccess);
    upload(d, h, 100 * sizeof(float), st);
    upload(e + 100, h + 100, 100 * sizeof(float), st1);
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    assert_int_equal(ncclAllGather(d, d, 100, ncclFloat, c[0], st), ncclSuccess);
    assert_int_equal(ncclAllGather(e + 100, e, 100, ncclFloat, c[1], st1), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st1), cudaSuccess);
    float gd[200], ge[200];
    download(gd, d, sizeof gd, st);
    download(ge, e, sizeof ge, st1);
    for (int i = 0; i < 200; i++) {
        assert_true(gd[i] == h[i]);
        assert_true(ge[i] == h[i]);
    }
    assert_int_equal(gm_violations(), 0);
    cudaFree(e);
    cudaStreamDestroy(st1);
    for (int r = 0; r < 2; r++)
        assert_int_equal(ncclCommDestroy(c[r]), ncclSuccess);
    cudaFree(d);
    cudaStreamDestroy(st);
}

/* ---- mismatch ---- */

static void mismatch_rank(rank_ctx *rc)
{
    abort_shared *sh = rc->shared;
    ncclComm_t comm = NULL;
    EXPECT_OK(rc, ncclCommInitRank(&comm, rc->n, sh->id, rc->rank));
    if (!comm)
        return;
    cudaStream_t st;
    EXPECT_CUDA(rc, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *d = dev_alloc(rc, 64 * sizeof(float)), h[64];
    for (int i = 0; i < 64; i++)
        h[i] = 5;
    upload(d, h, sizeof h, st);
    /* rank 1 sums 12 elements, the others 10 */
    EXPECT_OK(rc, ncclAllReduce(d, d, rc->rank == 1 ? 12 : 10, ncclFloat, ncclSum, comm, st));
    EXPECT_CUDA(rc, cudaStreamSynchronize(st));
    ncclResult_t a = ncclSuccess;
    EXPECT_OK(rc, ncclCommGetAsyncError(comm, &a));
    EXPECT(rc, a == ncclInvalidUsage, "mismatch: async error %s, expected invalid usage", ncclGetErrorString(a));
    EXPECT(rc, strstr(ncclGetLastError(comm), "mismatch") != NULL, "last error: %s", ncclGetLastError(comm));
    download(h, d, sizeof h, st);
    EXPECT(rc, h[0] == 5, "a mismatched collective moved data: %g", (double)h[0]);
    EXPECT_OK(rc, ncclCommAbort(comm));
    cudaStreamDestroy(st);
}

static void test_mismatch(void **state)
{
    (void)state;
    abort_shared sh;
    assert_int_equal(ncclGetUniqueId(&sh.id), ncclSuccess);
    gm_violations_reset();
    gm_nccl_stats_reset();
    run_ranks(3, mismatch_rank, &sh);
    gm_nccl_counters c;
    gm_nccl_stats(&c);
    assert_int_equal(c.mismatches, 3);
    assert_int_equal(gm_violations(), 3);
    gm_violations_reset();
}

/* ---- registration, memory ---- */

static void test_register(void **state)
{
    (void)state;
    ncclComm_t c[1];
    assert_int_equal(ncclCommInitAll(c, 1, NULL), ncclSuccess);
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    void *pool = NULL, *h = NULL, *h2 = NULL;
    assert_int_equal(ncclMemAlloc(&pool, 1 << 16), ncclSuccess);
    assert_int_equal(ncclCommRegister(c[0], pool, 1 << 16, &h), ncclSuccess);
    float *f = pool, *g = NULL;
    assert_int_equal(cudaMalloc((void **)&g, 1024), cudaSuccess);
    gm_nccl_stats_reset();
    assert_int_equal(ncclAllReduce(f, f + 256, 256, ncclFloat, ncclSum, c[0], st), ncclSuccess);
    assert_int_equal(ncclAllReduce(g, g, 256, ncclFloat, ncclSum, c[0], st), ncclSuccess);
    assert_int_equal(ncclAllReduce(f, g, 256, ncclFloat, ncclSum, c[0], st), ncclSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    gm_nccl_counters k;
    gm_nccl_stats(&k);
    assert_int_equal(k.collectives, 3);
    assert_int_equal(k.registered, 1); /* only the first has every buffer registered */
    /* registering memory that is not the device's is refused */
    char host[64];
    assert_int_equal(ncclCommRegister(c[0], host, sizeof host, &h2), ncclInvalidArgument);
    gm_violations_reset();
    assert_int_equal(ncclCommDeregister(c[0], (void *)host), ncclInvalidArgument);
    assert_int_equal(gm_violations(), 1);
    gm_violations_reset();
    assert_int_equal(ncclCommDeregister(c[0], h), ncclSuccess);
    assert_int_equal(ncclCommDeregister(c[0], h), ncclInvalidArgument); /* twice */
    gm_violations_reset();
    assert_int_equal(ncclCommDestroy(c[0]), ncclSuccess);
    assert_int_equal(ncclMemFree(pool), ncclSuccess);
    cudaFree(g);
    cudaStreamDestroy(st);
    int v = 0;
    assert_int_equal(ncclGetVersion(&v), ncclSuccess);
    assert_int_equal(v, NCCL_VERSION_CODE);
    assert_string_equal(ncclGetErrorString(ncclInProgress), "NCCL operation in progress");
}

/* ---- joining errors ---- */

/* A rank given twice, and nranks that differ from the first rank's, are
 * refused at once (the first rank is nonblocking, so it can be aborted while
 * it still waits for its peers). */
static void test_join_errors(void **state)
{
    (void)state;
    ncclUniqueId id;
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t first = NULL, c = NULL;
    assert_int_equal(ncclCommInitRankConfig(&first, 2, id, 0, &cfg), ncclInProgress);
    usleep(20000);
    assert_int_equal(ncclCommInitRank(&c, 2, id, 0), ncclInvalidArgument);
    assert_null(c);
    assert_non_null(strstr(ncclGetLastError(NULL), "twice"));
    assert_int_equal(ncclCommInitRank(&c, 3, id, 1), ncclInvalidArgument);
    assert_null(c);
    assert_non_null(strstr(ncclGetLastError(NULL), "nranks 3"));
    assert_int_equal(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument); /* rank out of range */
    ncclUniqueId bogus;
    memset(&bogus, 0x5a, sizeof bogus);
    assert_int_equal(ncclCommInitRank(&c, 2, bogus, 1), ncclInvalidArgument);
    ncclResult_t st = ncclSuccess;
    assert_int_equal(ncclCommGetAsyncError(first, &st), ncclSuccess);
    assert_int_equal(st, ncclInProgress); /* still waiting for rank 1 */
    assert_int_equal(ncclCommAbort(first), ncclSuccess);
}

/* ---- shared-memory files ---- */

static int count_files(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void test_files_cleaned(void **state)
{
    (void)state;
    /* every communicator of this process joined (or was aborted): no file */
    char prefix[64];
    snprintf(prefix, sizeof prefix, "gmnccl-%d-", (int)getpid());
    assert_int_equal(count_files(prefix), 0);
    /* a crashed run's file, named by a process that no longer exists */
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(0);
    assert_int_equal(waitpid(child, NULL, 0), child);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/gmnccl-%d-0123456789abcdef-0", (int)child);
    int fd = open(path, O_CREAT | O_RDWR, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(access(path, F_OK), 0);
    ncclUniqueId id;
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    assert_int_equal(access(path, F_OK), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_groups_two_comms),
        cmocka_unit_test(test_group_one_thread),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_nonblocking),
        cmocka_unit_test(test_abort_releases_peer),
        cmocka_unit_test(test_abort_own_blocked_work),
        cmocka_unit_test(test_inplace_rules),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_register),
        cmocka_unit_test(test_join_errors),
        cmocka_unit_test(test_files_cleaned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
