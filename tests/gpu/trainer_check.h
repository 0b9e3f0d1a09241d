/*
 * trainer_check: what the device tests (test_nccl_device, test_cuda_local_device)
 * check, written once and independent of where the buffers live, so that
 * test_trainer_check_local replays the very same checks on the CPU local
 * backend, with the same schedules and so the same arena offsets, on every
 * machine (a device is lent rarely; a check that is wrong must fail here).
 *
 * A trainer rank: main_weight of tensor t at tensor index i is
 * mf_pattern(7 + t, i); grad_local of tensor t in microbatch m on rank r is
 * mf_pattern(tc_grad_seed(r, m', t), i), written inside its backward window,
 * where m' = tc_grad_microbatch(m): m, or 1 for the middle microbatches of a
 * step replayed as per-position CUDA graphs (the middle graph, captured at
 * microbatch 1, is what runs for microbatches 1..M-2).
 * Each unit's unsharded weights are copied out inside the unit's forward and
 * backward windows (the only time a weight view is valid: since static buffer
 * reuse the same bytes hold other buffers outside them, docs/runtime.md §6).
 * tc_verify then wants every delivered gradient shard to equal
 * (1/N if avg) * sum over ranks and microbatches of the local gradients
 * (rounded to grad_local's dtype), and every copied weight the cast
 * main_weight, bit for bit: the values are multiples of 1/64 and the meshes
 * powers of two, so every sum is exact whatever the order.
 *
 * Where the memory is and how work is ordered is the caller's (tc_ops): on a
 * GPU every op is enqueued on the trainer's compute stream, on a CPU it runs
 * at once. Errors: the first problem goes to tr->err and the call returns
 * false.
 */
#ifndef TRAINER_CHECK_H
#define TRAINER_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mfsdp.h"
#include "rt_testlib.h"

/* The cases the device tests run, and so their CPU replay: */
extern const char *const tc_nccl_modes[];   /* test_nccl_device's eager steps, 1x1, M = 3 */
extern const int tc_nccl_nmodes;
enum { TC_GRAPH_MIN_M = 2, TC_GRAPH_MAX_M = 4 }; /* its graph captures, hfsdp 1x1 */
extern const rt_mesh tc_local_meshes[];     /* test_cuda_local_device's, every mode on each, M = 3 */
extern const int tc_local_nmeshes;
extern const char *const tc_local_modes[];
extern const int tc_local_nmodes;
/* The reduction of tc_local_modes[k] (avg and sum alternate). */
mf_reduce tc_local_reduce(int k);

typedef struct tc_ops {
    /* n elements of dtype t at buf <- mf_pattern(seed, i), ordered after the
     * hooks called so far and before the next one */
    bool (*fill)(void *ctx, void *buf, mfsdp_dtype t, int64_t n, uint32_t seed);
    /* bytes from src to dst, ordered like fill */
    bool (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    /* bytes from host into dst, complete on return */
    bool (*write)(void *ctx, void *dst, const void *host, size_t bytes);
    /* bytes of src into host, after everything enqueued so far completed */
    bool (*read)(void *ctx, void *host, const void *src, size_t bytes);
    /* memory for the weight copies, in the same space as the views */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*release)(void *ctx, void *p);
    /* NULL, or called before the first hook of microbatch m and after its
     * last (a graph capture per microbatch) */
    bool (*microbatch_begin)(void *ctx, int64_t m);
    bool (*microbatch_end)(void *ctx, int64_t m);
} tc_ops;

typedef struct tc_trainer {
    mfsdp_runtime *rt;          /* borrowed */
    const mfsdp_schedule *sh;   /* borrowed */
    const tc_ops *ops;
    void *ctx;                  /* handed to every op */
    int64_t rank;
    int ntensors;
    void **seen[2];             /* per tensor: its weight as copied inside its
                                   forward [0] and backward [1] window */
    bool positions;             /* the step runs as one CUDA graph per microbatch
                                   position (first, middle, last), the middle one
                                   captured at microbatch 1 and replayed for
                                   1..M-2: their grad_local then holds microbatch
                                   1's values (tc_grad_microbatch). Set after
                                   tc_open; false: every microbatch its own */
    char err[512];              /* first problem, "" when none */
} tc_trainer;

/* Grad_local seed of tensor t in microbatch m on rank r. */
uint32_t tc_grad_seed(int64_t rank, int64_t m, int t);
/* The microbatch whose grad_local values microbatch m computes: m, or 1 for
 * a middle microbatch (0 < m < M-1) of a trainer with `positions`. */
int64_t tc_grad_microbatch(const tc_trainer *tr, int64_t m);

/* Borrows rt, sh, ops and ctx. Allocates the weight copies and writes every
 * main_weight shard. tc_close frees what tc_open allocated (not rt); call it
 * after tc_open whatever it returned. */
bool tc_open(tc_trainer *tr, mfsdp_runtime *rt, const mfsdp_schedule *sh, int64_t rank, const tc_ops *ops,
             void *ctx);
void tc_close(tc_trainer *tr);

/* Every delivered gradient shard <- 0xff bytes (NaN), so a gradient the step
 * does not deliver fails tc_verify. */
bool tc_poison_grads(tc_trainer *tr);

/* One step's hooks: step_begin, then per microbatch forward over the units
 * and backward in reverse (grad_local filled, weights copied in the windows),
 * step_end after the last. */
bool tc_step(tc_trainer *tr);

/* After mfsdp_synchronize: the delivered gradients and the weights copied in
 * the windows against the expected values (see the top). */
bool tc_verify(tc_trainer *tr);

/* `steps` times: tc_poison_grads, tc_step, tc_verify. */
bool tc_train(tc_trainer *tr, int steps);

/* The check the device tests used to make: every weight view read now, after
 * the step, outside every window. Fails (names the tensor) where the bytes
 * were reused; test_trainer_check_local shows that they are. */
bool tc_verify_weights_after_step(tc_trainer *tr);

/* Runs rank_main(arg, g, r, err, errlen) on one thread per rank of sh's world
 * with a fresh local group; returns false with the first rank's message when
 * a rank returned false. */
typedef bool (*tc_rank_main)(void *arg, mfsdp_local_group *g, int64_t rank, char *err, size_t errlen);
bool tc_run_thread_ranks(const mfsdp_schedule *sh, tc_rank_main rank_main, void *arg, char *err, size_t errlen);

#endif
