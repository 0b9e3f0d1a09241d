/*
 * test_cudart_util: host work for the CUDA runtime model's self-tests --
 * gm_enqueue items that write, read or log integers after an optional sleep,
 * so a test sees in what order and against what values the model ran them.
 */
#ifndef TEST_CUDART_UTIL_H
#define TEST_CUDART_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "gm_model.h"

typedef struct tc_op {
    int *dst;          /* written: *dst = value, or *dst = *src (+ add) */
    const int *src;
    int value;
    int add;
    unsigned sleep_us;
    int *log;          /* when set: log[(*logn)++] = value */
    int *logn;
    const int *gate;   /* when set: first wait (at most 10 s) until *gate != 0 */
} tc_op;

static cudaError_t tc_op_run(void *a, char *err, size_t len)
{
    (void)err, (void)len;
    tc_op *o = a;
    for (int i = 0; o->gate && i < 100000 && !__atomic_load_n(o->gate, __ATOMIC_SEQ_CST); i++)
        usleep(100);
    if (o->sleep_us)
        usleep(o->sleep_us);
    if (o->log) {
        int i = __atomic_fetch_add(o->logn, 1, __ATOMIC_SEQ_CST);
        __atomic_store_n(&o->log[i], o->value, __ATOMIC_SEQ_CST);
    }
    if (o->dst) {
        int v = o->src ? __atomic_load_n(o->src, __ATOMIC_SEQ_CST) + o->add : o->value;
        __atomic_store_n(o->dst, v, __ATOMIC_SEQ_CST);
    }
    return cudaSuccess;
}

static void tc_op_free(void *a)
{
    free(a);
}

/* Enqueues *dst = value after sleep_us. */
static inline cudaError_t tc_write(cudaStream_t s, int *dst, int value, unsigned sleep_us)
{
    tc_op *o = calloc(1, sizeof *o);
    o->dst = dst, o->value = value, o->sleep_us = sleep_us;
    cudaError_t e = gm_enqueue(s, "tc_write", tc_op_run, o, tc_op_free);
    if (e != cudaSuccess)
        free(o);
    return e;
}

/* Enqueues *dst = value once *gate != 0: work that cannot complete before the
 * test releases it, so "this did not wait" is shown without timing. */
static inline cudaError_t tc_write_gated(cudaStream_t s, int *dst, int value, const int *gate)
{
    tc_op *o = calloc(1, sizeof *o);
    o->dst = dst, o->value = value, o->gate = gate;
    cudaError_t e = gm_enqueue(s, "tc_write_gated", tc_op_run, o, tc_op_free);
    if (e != cudaSuccess)
        free(o);
    return e;
}

static inline void tc_release(int *gate)
{
    __atomic_store_n(gate, 1, __ATOMIC_SEQ_CST);
}

/* Enqueues *dst = *src + add after sleep_us. */
static inline cudaError_t tc_copy(cudaStream_t s, int *dst, const int *src, int add, unsigned sleep_us)
{
    tc_op *o = calloc(1, sizeof *o);
    o->dst = dst, o->src = src, o->add = add, o->sleep_us = sleep_us;
    cudaError_t e = gm_enqueue(s, "tc_copy", tc_op_run, o, tc_op_free);
    if (e != cudaSuccess)
        free(o);
    return e;
}

/* Enqueues log[(*logn)++] = value after sleep_us. */
static inline cudaError_t tc_log(cudaStream_t s, int *log, int *logn, int value, unsigned sleep_us)
{
    tc_op *o = calloc(1, sizeof *o);
    o->log = log, o->logn = logn, o->value = value, o->sleep_us = sleep_us;
    cudaError_t e = gm_enqueue(s, "tc_log", tc_op_run, o, tc_op_free);
    if (e != cudaSuccess)
        free(o);
    return e;
}

static inline int tc_load(const int *p)
{
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

/* Expects exactly n violations since the last reset, then resets. */
#define TC_VIOLATIONS(n)                                                                          \
    do {                                                                                          \
        assert_int_equal(gm_violations(), (n));                                                   \
        gm_violations_reset();                                                                    \
    } while (0)

static inline dim3 dim3_of(unsigned x)
{
    dim3 d = {x, 1, 1};
    return d;
}

#define TC_OK(call) assert_int_equal((call), cudaSuccess)

#endif
