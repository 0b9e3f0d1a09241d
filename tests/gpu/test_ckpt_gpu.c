/*
 * A checkpoint round trip on cuda-local (argv: a compiled schedule, a
 * scratch directory): every thread-rank fills its device main_weight and two
 * device Adam states with values that depend on the element only, saves
 * (through the backend's stage hook: cudaMemcpy to host, runtime/
 * mf_ckpt_stage.h), zeroes them on the device, loads, and copies them back:
 * every value bit for bit; then exports main_weight as a Hugging Face
 * checkpoint, zeroes it, imports it back: bit for bit again. The test's own
 * device writes and reads run on the runtime's compute stream and complete
 * before the next call (put/get/zero): the runtime's streams are
 * non-blocking, so nothing would order legacy-stream copies with the
 * save's and load's. Its host buffer holds the largest shard. Needs a GPU: exits 77 (skip) only when there is no
 * device (gpu_presence.h). Run by tests/gpu/device-check.sh.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cuda_runtime.h>

#include "gpu_presence.h"
#include "mfsdp.h"
#include "mfsdp_ckpt.h"
#include "mfsdp_nccl.h"

#define MAXR 64

static const mfsdp_schedule *g_sh;
static mfsdp_local_group *g_group;
static pthread_barrier_t g_bar;
static const char *g_dir;

static float value(int state, int64_t element, int tensor)
{
    return (float)(element * 3 + state) * 0.25f + (float)tensor;
}

typedef struct rank_job {
    int64_t rank;
    char err[512];
} rank_job;

#define FAIL(...) do { snprintf(j->err, sizeof j->err, __VA_ARGS__); goto done; } while (0)
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) FAIL("%s: %s", #x, cudaGetErrorString(e_)); } while (0)

/* Device writes and reads of the test, on the runtime's compute stream and
 * complete on return: the runtime's streams are non-blocking, so a plain
 * cudaMemcpy / cudaMemset on the legacy stream would not be ordered with
 * the save's and load's copies (the checkpoint code synchronizes the
 * runtime's streams, not the legacy one). */
static cudaError_t put(cudaStream_t s, void *dst, const void *host, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, s);
    return e == cudaSuccess ? cudaStreamSynchronize(s) : e;
}

static cudaError_t get(cudaStream_t s, void *host, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, s);
    return e == cudaSuccess ? cudaStreamSynchronize(s) : e;
}

static cudaError_t zero(cudaStream_t s, void *dst, size_t bytes)
{
    cudaError_t e = cudaMemsetAsync(dst, 0, bytes, s);
    return e == cudaSuccess ? cudaStreamSynchronize(s) : e;
}

/* The largest shard of rt's tensors, in bytes of fp32. */
static size_t max_shard_bytes(mfsdp_runtime *rt)
{
    size_t most = 0;
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        size_t bytes = (size_t)v.shard_count * sizeof(float);
        if (bytes > most)
            most = bytes;
    }
    return most;
}

/* Every shard of state s (0: main_weight, 1, 2: the Adam states) against
 * value(); `when` names the moment in the message. */
static int check_states(rank_job *j, mfsdp_runtime *rt, cudaStream_t cs, void **st[2], float *host, int nstates,
                        const char *when)
{
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        size_t bytes = (size_t)v.shard_count * sizeof(float);
        for (int s = 0; s < nstates; s++) {
            CK(get(cs, host, s ? st[s - 1][k] : v.main_weight, bytes));
            for (int64_t i = 0; i < v.shard_count; i++)
                if (host[i] != value(s, v.shard_offset + i, k))
                    FAIL("tensor %s state %d element %lld: %g %s, %g saved", v.name, s,
                         (long long)(v.shard_offset + i), (double)host[i], when,
                         (double)value(s, v.shard_offset + i, k));
        }
    }
    return 1;
done:
    return 0;
}

/* main_weight and the two states of every tensor <- value(), allocating the
 * states; 0 with j->err on failure. */
static int fill_states(rank_job *j, mfsdp_runtime *rt, cudaStream_t cs, void **st[2], float *host)
{
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        size_t bytes = (size_t)v.shard_count * sizeof(float);
        for (int s = 0; s < 3; s++) {
            for (int64_t i = 0; i < v.shard_count; i++)
                host[i] = value(s, v.shard_offset + i, k);
            if (s > 0)
                CK(cudaMalloc(&st[s - 1][k], bytes + sizeof(float)));
            CK(put(cs, s ? st[s - 1][k] : v.main_weight, host, bytes));
        }
    }
    return 1;
done:
    return 0;
}

/* Zeroes main_weight and, when states, the two states of every tensor. */
static int zero_states(rank_job *j, mfsdp_runtime *rt, cudaStream_t cs, void **st[2], int states)
{
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        size_t bytes = (size_t)v.shard_count * sizeof(float);
        CK(zero(cs, v.main_weight, bytes));
        for (int s = 0; states && s < 2; s++)
            CK(zero(cs, st[s][k], bytes));
    }
    return 1;
done:
    return 0;
}

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    mfsdp_runtime *rt = NULL;
    void **st[2] = {NULL, NULL};
    float *host = NULL;
    int nt = 0, waited = 0;
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    nc.watchdog_poll_ms = 0;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_cuda_local(&cfg, g_group, &nc);
    cfg.rank = j->rank;
    cfg.timeout_ms = 60000;
    if (mfsdp_create(g_sh, &cfg, &rt) != MFSDP_OK)
        FAIL("create: %s", mfsdp_last_error(NULL));
    cudaStream_t cs = mfsdp_nccl_stream(rt, MFSDP_STREAM_COMPUTE);
    nt = mfsdp_num_tensors(rt);
    st[0] = calloc((size_t)nt + 1, sizeof(void *));
    st[1] = calloc((size_t)nt + 1, sizeof(void *));
    host = malloc(max_shard_bytes(rt) + sizeof(float)); /* every shard fits */
    if (!cs || !st[0] || !st[1] || !host)
        FAIL("no compute stream or out of memory");
    if (!fill_states(j, rt, cs, st, host))
        goto done;
    mfsdp_ckpt_state states[2] = {{"exp_avg", MFSDP_FP32, st[0]}, {"exp_avg_sq", MFSDP_FP32, st[1]}};
    mfsdp_ckpt_save_options so = MFSDP_CKPT_SAVE_OPTIONS_INIT;
    so.step = 3, so.nstates = 2, so.states = states;
    waited = 1;
    pthread_barrier_wait(&g_bar);
    if (mfsdp_ckpt_save(rt, g_dir, &so) != MFSDP_OK)
        FAIL("save: %s", mfsdp_last_error(rt));
    if (!zero_states(j, rt, cs, st, 1))
        goto done;
    mfsdp_ckpt_load_options lo = MFSDP_CKPT_LOAD_OPTIONS_INIT;
    lo.nstates = 2, lo.states = states;
    if (mfsdp_ckpt_load(rt, g_dir, &lo) != MFSDP_OK || lo.step != 3)
        FAIL("load: %s", mfsdp_last_error(rt));
    if (!check_states(j, rt, cs, st, host, 3, "after the load"))
        goto done;
    /* Hugging Face export of main_weight, zeroed, imported back. */
    char hf[4200];
    snprintf(hf, sizeof hf, "%s-hf", g_dir);
    if (mfsdp_ckpt_export_hf(rt, hf, MFSDP_FP32, NULL, 0) != MFSDP_OK)
        FAIL("export: %s", mfsdp_last_error(rt));
    if (!zero_states(j, rt, cs, st, 0))
        goto done;
    if (mfsdp_ckpt_import_hf(rt, hf, NULL) != MFSDP_OK)
        FAIL("import: %s", mfsdp_last_error(rt));
    check_states(j, rt, cs, st, host, 1, "after export and import");
done:
    if (!waited)
        pthread_barrier_wait(&g_bar); /* the others' save then fails on this rank's absence: bounded by the timeout */
    for (int k = 0; k < nt; k++)
        for (int s = 0; s < 2; s++)
            if (st[s] && st[s][k])
                cudaFree(st[s][k]);
    free(st[0]);
    free(st[1]);
    free(host);
    mfsdp_destroy(rt);
    return NULL;
}

int main(int argc, char **argv)
{
    int presence = gpu_presence();
    if (presence != GPU_PRESENT)
        return presence;
    if (argc != 3) {
        fprintf(stderr, "usage: test_ckpt_gpu SCHEDULE DIR\n");
        return 2;
    }
    mfsdp_schedule *sh;
    if (mfsdp_schedule_load(argv[1], &sh) != MFSDP_OK) {
        fprintf(stderr, "%s\n", mfsdp_last_error(NULL));
        return 1;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test_ckpt_gpu.%ld", argv[2], (long)getpid());
    g_sh = sh;
    g_dir = dir;
    int64_t w = mfsdp_schedule_world_size(sh);
    if (w > MAXR || mfsdp_local_group_create(w, &g_group) != MFSDP_OK)
        return 1;
    pthread_barrier_init(&g_bar, NULL, (unsigned)w);
    pthread_t th[MAXR];
    static rank_job jobs[MAXR];
    for (int64_t r = 0; r < w; r++) {
        jobs[r].rank = r;
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    int bad = 0;
    for (int64_t r = 0; r < w; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].err[0]) {
            fprintf(stderr, "rank %lld: %s\n", (long long)r, jobs[r].err);
            bad = 1;
        }
    }
    mfsdp_local_group_destroy(g_group);
    mfsdp_schedule_free(sh);
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s-hf'", dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    printf("%s: checkpoint round trip on cuda-local, %lld ranks\n", bad ? "FAIL" : "ok", (long long)w);
    return bad;
}
