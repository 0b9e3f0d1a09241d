/*
 * The device kernels (runtime/mf_cuda_kernels.cu) against host references,
 * bit for bit: every dtype pair of cast and accumulate, scale, the multi-source
 * multi-destination reduce with an aliased (in-place) destination, aligned
 * (vectorized) and unaligned pointers, ragged sizes, guard elements past the
 * end that must stay untouched, capture into a CUDA graph (no host
 * synchronization inside), a launch right after polling a pending event
 * (the stale cudaErrorNotReady of the first device run), and argument errors. Needs a GPU: exits 77 (skip)
 * only when there is no device (gpu_presence.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "gpu_presence.h"
#include "mf_cuda_guard.h"
#include "mf_cuda_kernels.h"

#define CK(x) assert_int_equal((int)(x), (int)cudaSuccess)
#define GUARD 24          /* poisoned elements after every destination */
#define POISON 0xA5

static cudaStream_t stream;

static const mf_dtype dtypes[3] = {MF_FP32, MF_BF16, MF_FP16};
static const int64_t sizes[] = {1, 7, 8, 9, 31, 4099, (1 << 18) + 5};

static size_t esize(mf_dtype t) { return t == MF_FP32 ? 4 : 2; }

static float dec(mf_dtype t, const void *p, int64_t i)
{
    if (t == MF_FP32)
        return ((const float *)p)[i];
    uint16_t b = ((const uint16_t *)p)[i];
    return t == MF_BF16 ? mf_cuda_host_from_bf16(b) : mf_cuda_host_from_fp16(b);
}

static void enc(mf_dtype t, void *p, int64_t i, float v)
{
    if (t == MF_FP32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = t == MF_BF16 ? mf_cuda_host_to_bf16(v) : mf_cuda_host_to_fp16(v);
}

/* Values with full fp32 mantissas (so casts round), of both signs, over a range
 * that stays finite in fp16, plus exact ties for bf16. */
static uint32_t rng = 99;
static float draw(void)
{
    rng = rng * 1664525u + 1013904223u;
    if ((rng >> 28) == 0) {
        uint32_t tie = 0x3f808000u | ((rng & 0xff) << 16); /* bf16 halfway cases */
        float f;
        memcpy(&f, &tie, sizeof f);
        return f;
    }
    float f = ldexpf((float)(rng >> 8) / 16777216.0f, (int)(rng % 24) - 12);
    return (rng & 0x100) ? -f : f;
}

static void fill_host(mf_dtype t, void *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        enc(t, p, i, draw());
}

/* Device buffer of n elements + GUARD, offset by `shift` elements (to defeat
 * 16-byte alignment when shift is odd). */
typedef struct dbuf {
    char *base;
    void *p;
    mf_dtype t;
    int64_t n;
} dbuf;

static dbuf dalloc(mf_dtype t, int64_t n, int shift)
{
    dbuf b = {.t = t, .n = n};
    size_t bytes = (size_t)(n + GUARD + 8) * esize(t);
    CK(cudaMalloc((void **)&b.base, bytes));
    CK(cudaMemset(b.base, POISON, bytes));
    CK(cudaDeviceSynchronize()); /* the legacy stream does not order our non-blocking one */
    b.p = b.base + (size_t)shift * esize(t);
    return b;
}

static void upload(dbuf *b, const void *host)
{
    CK(cudaMemcpy(b->p, host, (size_t)b->n * esize(b->t), cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

/* Downloads n elements and checks the guard is still poisoned. */
static void *download(const dbuf *b)
{
    size_t bytes = (size_t)(b->n + GUARD) * esize(b->t);
    unsigned char *h = malloc(bytes);
    assert_non_null(h);
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(h, b->p, bytes, cudaMemcpyDeviceToHost));
    for (size_t k = (size_t)b->n * esize(b->t); k < bytes; k++)
        assert_int_equal(h[k], POISON);
    return h;
}

static void dfree(dbuf *b)
{
    CK(cudaFree(b->base));
}

/* Bit-exact comparison; NaN equals NaN. */
static void expect_equal(mf_dtype t, const void *got, const void *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        float g = dec(t, got, i), w = dec(t, want, i);
        bool same = (isnan(g) && isnan(w)) ||
                    (t == MF_FP32 ? memcmp((const float *)got + i, (const float *)want + i, 4) == 0
                                  : ((const uint16_t *)got)[i] == ((const uint16_t *)want)[i]);
        if (!same)
            fail_msg("%s: element %lld of %lld: got %.9g want %.9g", what, (long long)i, (long long)n, (double)g,
                     (double)w);
    }
}

static void test_cast_all_pairs(void **state)
{
    (void)state;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
                for (int shift = 0; shift < 2; shift++) {
                    mf_dtype st = dtypes[a], dt = dtypes[b];
                    int64_t n = sizes[z];
                    void *hs = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
                    assert_non_null(hs);
                    assert_non_null(want);
                    fill_host(st, hs, n);
                    for (int64_t i = 0; i < n; i++)
                        enc(dt, want, i, dec(st, hs, i));
                    dbuf s = dalloc(st, n, shift), d = dalloc(dt, n, 0);
                    upload(&s, hs);
                    CK(mf_cuda_cast(d.p, dt, s.p, st, n, stream));
                    void *got = download(&d);
                    char what[64];
                    snprintf(what, sizeof what, "cast %s->%s n=%lld shift=%d", mf_dtype_name(st),
                             mf_dtype_name(dt), (long long)n, shift);
                    expect_equal(dt, got, want, n, what);
                    free(got);
                    free(hs);
                    free(want);
                    dfree(&s);
                    dfree(&d);
                }
}

static void test_accumulate(void **state)
{
    (void)state;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int shift = 0; shift < 2; shift++) {
                mf_dtype st = dtypes[a], dt = dtypes[b];
                int64_t n = 4099;
                void *hs = malloc((size_t)n * 4), *hd = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
                assert_non_null(hs);
                assert_non_null(hd);
                assert_non_null(want);
                fill_host(st, hs, n);
                fill_host(dt, hd, n);
                dbuf s = dalloc(st, n, 0), d = dalloc(dt, n, shift);
                upload(&s, hs);
                upload(&d, hd);
                /* microbatch 0 overwrites */
                CK(mf_cuda_accumulate(d.p, dt, s.p, st, n, true, stream));
                for (int64_t i = 0; i < n; i++)
                    enc(dt, want, i, dec(st, hs, i));
                void *got = download(&d);
                expect_equal(dt, got, want, n, "accumulate overwrite");
                free(got);
                /* later microbatches add, in fp32, rounded once */
                for (int rep = 0; rep < 2; rep++) {
                    CK(mf_cuda_accumulate(d.p, dt, s.p, st, n, false, stream));
                    for (int64_t i = 0; i < n; i++)
                        enc(dt, want, i, dec(dt, want, i) + dec(st, hs, i));
                }
                got = download(&d);
                expect_equal(dt, got, want, n, "accumulate add");
                free(got);
                free(hs);
                free(hd);
                free(want);
                dfree(&s);
                dfree(&d);
            }
}

static void test_scale(void **state)
{
    (void)state;
    const float alphas[] = {0.25f, 1.0f / 3.0f, -2.0f};
    for (int a = 0; a < 3; a++)
        for (int k = 0; k < 3; k++) {
            mf_dtype t = dtypes[a];
            int64_t n = 10007;
            void *h = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
            assert_non_null(h);
            assert_non_null(want);
            fill_host(t, h, n);
            for (int64_t i = 0; i < n; i++)
                enc(t, want, i, dec(t, h, i) * alphas[k]);
            dbuf d = dalloc(t, n, 0);
            upload(&d, h);
            CK(mf_cuda_scale(d.p, t, n, alphas[k], stream));
            void *got = download(&d);
            expect_equal(t, got, want, n, "scale");
            free(got);
            free(h);
            free(want);
            dfree(&d);
        }
}

/* The one-GPU all-reduce: 5 sources summed in order, averaged, written to 3
 * destinations of which one is source 2 itself (in place). */
static void test_combine_reduce(void **state)
{
    (void)state;
    enum { K = 5, J = 3 };
    for (int a = 0; a < 3; a++)
        for (int shift = 0; shift < 2; shift++) {
            mf_dtype t = dtypes[a];
            int64_t n = 70001;
            void *h[K], *want = malloc((size_t)n * 4);
            dbuf s[K], d[J - 1];
            assert_non_null(want);
            for (int k = 0; k < K; k++) {
                h[k] = malloc((size_t)n * 4);
                assert_non_null(h[k]);
                fill_host(t, h[k], n);
                s[k] = dalloc(t, n, shift);
                upload(&s[k], h[k]);
            }
            for (int j = 0; j < J - 1; j++)
                d[j] = dalloc(t, n, 0);
            /* averaged like the CPU backends: the sum divided by the group size */
            for (int64_t i = 0; i < n; i++) {
                float acc = dec(t, h[0], i);
                for (int k = 1; k < K; k++)
                    acc = acc + dec(t, h[k], i);
                enc(t, want, i, acc / (float)K);
            }
            const void *srcs[K];
            for (int k = 0; k < K; k++)
                srcs[k] = s[k].p;
            void *dsts[J] = {d[0].p, s[2].p, d[1].p};
            CK(mf_cuda_combine(dsts, J, t, srcs, K, t, n, (float)K, MF_CUDA_DIV, false, stream));
            void *got[3] = {download(&d[0]), download(&s[2]), download(&d[1])};
            for (int j = 0; j < J; j++) {
                expect_equal(t, got[j], want, n, "combine");
                free(got[j]);
            }
            for (int k = 0; k < K; k++) {
                free(h[k]);
                dfree(&s[k]);
            }
            for (int j = 0; j < J - 1; j++)
                dfree(&d[j]);
            free(want);
        }
}

/* d's contents equal want (host, n elements of d's dtype); frees both. */
static void expect_pattern_and_free(dbuf *d, void *want, const char *what)
{
    void *got = download(d);
    expect_equal(d->t, got, want, d->n, what);
    free(got);
    free(want);
    dfree(d);
}

static void test_fill_pattern(void **state)
{
    (void)state;
    for (int a = 0; a < 3; a++) {
        mf_dtype t = dtypes[a];
        int64_t n = 5000;
        void *want = malloc((size_t)n * 4);
        assert_non_null(want);
        for (int64_t i = 0; i < n; i++)
            enc(t, want, i, mf_cuda_pattern(42, i));
        dbuf d = dalloc(t, n, 1);
        CK(mf_cuda_fill_pattern(d.p, t, n, 42, stream));
        expect_pattern_and_free(&d, want, "fill");
    }
}

/* The old first-run bug: a query that finds an event not ready leaves
 * cudaErrorNotReady as the thread's last error, and a launch checked by
 * cudaGetLastError then failed with "device not ready". Polled while a spin
 * kernel keeps the event pending, with the raw query and the runtime's
 * (mf_cuda_query_event), each later launch returns success and computes. */
static void test_poll_before_launch(void **state)
{
    (void)state;
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    int64_t n = 4096;
    float *want = malloc((size_t)n * sizeof *want);
    assert_non_null(want);
    for (int64_t i = 0; i < n; i++)
        want[i] = mf_cuda_pattern(9, i);
    dbuf d = dalloc(MF_FP32, n, 1);
    CK(mf_cuda_spin(300 * 1000 * 1000, stream)); /* 300 ms: the host's polls below take microseconds */
    CK(cudaEventRecord(ev, stream));
    assert_int_equal(cudaEventQuery(ev), cudaErrorNotReady);
    CK(mf_cuda_fill_pattern(d.p, MF_FP32, n, 9, stream)); /* its own launch's result, not the stale one */
    assert_int_equal(mf_cuda_query_event(ev), cudaErrorNotReady);
    CK(cudaGetLastError()); /* the runtime's poll left nothing behind */
    CK(mf_cuda_scale(d.p, MF_FP32, n, 1.0f, stream));
    expect_pattern_and_free(&d, want, "fill after polls");
    CK(cudaEventDestroy(ev));
}

/* Kernels enqueue only: they can be captured into a graph and replayed. */
static void test_graph_capture(void **state)
{
    (void)state;
    int64_t n = 100003;
    float *h = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
    assert_non_null(h);
    assert_non_null(want);
    fill_host(MF_FP32, h, n);
    dbuf s = dalloc(MF_FP32, n, 0), acc = dalloc(MF_FP32, n, 0), b16 = dalloc(MF_BF16, n, 0);
    upload(&s, h);
    CK(cudaMemset(acc.p, 0, (size_t)n * 4));
    CK(cudaDeviceSynchronize());
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CK(mf_cuda_accumulate(acc.p, MF_FP32, s.p, MF_FP32, n, false, stream));
    CK(mf_cuda_cast(b16.p, MF_BF16, acc.p, MF_FP32, n, stream));
    CK(cudaStreamEndCapture(stream, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int rep = 0; rep < 3; rep++)
        CK(cudaGraphLaunch(ge, stream));
    for (int64_t i = 0; i < n; i++)
        want[i] = ((0.0f + h[i]) + h[i]) + h[i];
    float *got = download(&acc);
    expect_equal(MF_FP32, got, want, n, "graph accumulate");
    free(got);
    uint16_t *gb = download(&b16), *wb = malloc((size_t)n * 2);
    assert_non_null(wb);
    for (int64_t i = 0; i < n; i++)
        wb[i] = mf_cuda_host_to_bf16(want[i]);
    expect_equal(MF_BF16, gb, wb, n, "graph cast");
    free(gb);
    free(wb);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    dfree(&s);
    dfree(&acc);
    dfree(&b16);
    free(h);
    free(want);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    dbuf d = dalloc(MF_FP32, 16, 0);
    void *dsts[MF_CUDA_MAX_OPERANDS + 1];
    const void *srcs[MF_CUDA_MAX_OPERANDS + 1];
    for (int k = 0; k <= MF_CUDA_MAX_OPERANDS; k++) {
        dsts[k] = d.p;
        srcs[k] = d.p;
    }
    assert_int_equal(mf_cuda_combine(dsts, 1, MF_FP32, srcs, MF_CUDA_MAX_OPERANDS + 1, MF_FP32, 16, 1, MF_CUDA_MUL,
                                     false, stream),
                     cudaErrorInvalidValue);
    assert_int_equal(mf_cuda_combine(dsts, 0, MF_FP32, srcs, 1, MF_FP32, 16, 1, MF_CUDA_MUL, false, stream),
                     cudaErrorInvalidValue);
    assert_int_equal(mf_cuda_combine(dsts, 1, MF_FP32, srcs, 1, MF_FP32, 16, 2, (mf_cuda_scaling)5, false, stream),
                     cudaErrorInvalidValue);
    assert_int_equal(mf_cuda_cast(d.p, (mf_dtype)7, d.p, MF_FP32, 16, stream), cudaErrorInvalidValue);
    assert_int_equal(mf_cuda_cast(d.p, MF_BF16, NULL, MF_FP32, 16, stream), cudaErrorInvalidValue);
    assert_int_equal(mf_cuda_scale(d.p, MF_FP32, -1, 1, stream), cudaErrorInvalidValue);
    assert_int_equal(mf_cuda_scale(d.p, MF_FP32, 0, 1, stream), cudaSuccess);
    dfree(&d);
}

static int setup(void **state)
{
    (void)state;
    return cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return cudaStreamDestroy(stream) == cudaSuccess ? 0 : -1;
}

int main(void)
{
    int presence = gpu_presence();
    if (presence != GPU_PRESENT)
        return presence;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cast_all_pairs),
        cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_combine_reduce),
        cmocka_unit_test(test_fill_pattern),
        cmocka_unit_test(test_poll_before_launch),
        cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
