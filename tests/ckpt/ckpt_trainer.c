/*
 * ckpt-trainer: a deterministic trainer for the checkpoint tests
 * (tests/ckpt/CMakeLists.txt), public API only (mfsdp.h, mfsdp_ckpt.h,
 * mfsdp_mpi.h).
 *
 *   ckpt-trainer --schedule S [--backend local|mpi] [--steps N] [--load DIR]
 *                [--save DIR] [--dump FILE] [--kill-after-us US]
 *                [--kill-rank R]
 *
 * Every step each rank writes, per microbatch, a gradient that depends on the
 * unsharded weight, the step, the rank and the microbatch; after step_end it
 * applies Adam to its main_weight shard with two states (exp_avg,
 * exp_avg_sq). --load resumes from a checkpoint (master weights, both
 * states, and the user blob holding the step counter and an RNG word), on
 * this schedule whatever schedule saved it; without it the weights start from
 * a fixed function of (tensor name, element). --save checkpoints after the
 * last step. --dump writes every tensor's full master weight and both states
 * (tensors in name order, fp32 each) into FILE, assembled from the ranks'
 * shards by pwrite, so two runs compare with cmp whatever their layouts.
 * --verify-files 1 loads with MFSDP_CKPT_VERIFY_FILES.
 * --weights-only 1 loads main_weight only (an imported Hugging Face model).
 * --all-errors 1 (local backend) prints every failing rank's message, not
 * only the first.
 * --import-hf PATH [--map FROM=TO] sets main_weight from a Hugging Face
 * checkpoint through mfsdp_ckpt_import_hf (before any --load); --export-hf
 * DIR [--export-dtype fp32|bf16|fp16] [--export-max-file-bytes N] writes one
 * through mfsdp_ckpt_export_hf after training; --tie NAME=SOURCE applies to
 * both.
 * Rank 0 prints save_us=N, the save's duration in microseconds.
 * --kill-after-us makes rank R (--kill-rank, default 0) SIGKILL its own
 * process that many microseconds after the save starts (the crash tests).
 */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mfsdp.h"
#include "mfsdp_ckpt.h"
#ifdef CT_WITH_MPI
#include "mfsdp_mpi.h"
#endif

typedef struct ct_opts {
    const char *schedule, *load, *save, *dump, *import_hf, *map, *tie, *export_hf, *export_dtype;
    int64_t export_max;
    int mpi, weights_only, verify_files, all_errors;
    int64_t swap_states_rank; /* this rank passes the states in the other order (-1: none) */
    int64_t steps, kill_us, kill_rank;
} ct_opts;

typedef struct ct_blob {
    int64_t step;
    uint64_t rng;
} ct_blob;

typedef struct ct_job {
    const mfsdp_schedule *sh;
    const ct_opts *o;
    mfsdp_config cfg;
    int failed;
    char msg[2048];
} ct_job;

static uint64_t ct_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

static float ct_init(const char *name, int64_t i)
{
    uint64_t x = ct_hash(name) ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
}

static void *ct_kill(void *arg)
{
    int64_t us = *(int64_t *)arg;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    kill(getpid(), SIGKILL);
    return NULL;
}

/* Writes this rank's shards of the three arrays into the dump file. */
static int ct_dump(mfsdp_runtime *rt, const char *path, float **m, float **v)
{
    int nt = mfsdp_num_tensors(rt), fd = open(path, O_WRONLY | O_CREAT, 0644);
    if (fd < 0)
        return -1;
    /* Tensors in name order: offsets from a sorted index. */
    int *ord = malloc((size_t)nt * sizeof *ord);
    mfsdp_tensor_view *vw = malloc((size_t)nt * sizeof *vw);
    int rc = ord && vw ? 0 : -1;
    for (int k = 0; rc == 0 && k < nt; k++) {
        mfsdp_tensor_view_get(rt, k, &vw[k]);
        ord[k] = k;
    }
    for (int a = 0; rc == 0 && a < nt; a++)
        for (int b = a + 1; b < nt; b++)
            if (strcmp(vw[ord[b]].name, vw[ord[a]].name) < 0) {
                int t = ord[a];
                ord[a] = ord[b];
                ord[b] = t;
            }
    off_t at = 0;
    for (int a = 0; rc == 0 && a < nt; a++) {
        const mfsdp_tensor_view *x = &vw[ord[a]];
        const void *src[3] = {x->main_weight, m[ord[a]], v[ord[a]]};
        for (int s = 0; s < 3; s++) {
            off_t o = at + (off_t)(s * x->numel + x->shard_offset) * 4;
            if (x->shard_count && pwrite(fd, src[s], (size_t)x->shard_count * 4, o) != (ssize_t)x->shard_count * 4)
                rc = -1;
        }
        at += (off_t)(3 * x->numel) * 4;
    }
    free(ord);
    free(vw);
    if (close(fd) != 0)
        rc = -1;
    return rc;
}

#define CT_CHECK(call)                                                                                  \
    do {                                                                                                \
        mfsdp_result r_ = (call);                                                                       \
        if (r_ != MFSDP_OK) {                                                                           \
            snprintf(j->msg, sizeof j->msg, "rank %lld: %s: %s", (long long)j->cfg.rank, #call,           \
                     mfsdp_last_error(rt));                                                             \
            goto done;                                                                                  \
        }                                                                                               \
    } while (0)

/* One training step: gradients from the unsharded weights, then Adam. */
static mfsdp_result ct_step(mfsdp_runtime *rt, const mfsdp_schedule *sh, int64_t step, float **m, float **v)
{
    int nt = mfsdp_num_tensors(rt), nu = mfsdp_schedule_num_units(sh);
    int64_t M = mfsdp_schedule_microbatches(sh), rank = mfsdp_rank(rt);
    mfsdp_result r = mfsdp_step_begin(rt);
    for (int64_t mb = 0; r == MFSDP_OK && mb < M; mb++) {
        for (int u = 0; r == MFSDP_OK && u < nu; u++)
            if ((r = mfsdp_forward_pre(rt, u, mb)) == MFSDP_OK)
                r = mfsdp_forward_post(rt, u, mb);
        for (int u = nu - 1; r == MFSDP_OK && u >= 0; u--) {
            if ((r = mfsdp_backward_pre(rt, u, mb)) != MFSDP_OK)
                break;
            for (int k = 0; k < nt; k++) {
                mfsdp_tensor_view x;
                mfsdp_tensor_view_get(rt, k, &x);
                if (x.unit != u)
                    continue;
                for (int64_t i = 0; i < x.numel; i++) {
                    float w = x.weight_dtype == MFSDP_FP32 ? ((float *)x.weight)[i] : 0.0f;
                    if (x.weight_dtype == MFSDP_BF16) {
                        uint32_t b = (uint32_t)((uint16_t *)x.weight)[i] << 16;
                        memcpy(&w, &b, 4);
                    }
                    float g = 0.1f * sinf(1.3f * w + 0.01f * (float)i) +
                              0.01f * (float)(rank + 1) * (float)(mb + 1) * cosf(0.7f * (float)step + (float)i);
                    if (x.grad_local_dtype == MFSDP_FP32) {
                        ((float *)x.grad_local)[i] = g;
                    } else {
                        uint32_t b;
                        memcpy(&b, &g, 4);
                        ((uint16_t *)x.grad_local)[i] = (uint16_t)(b >> 16); /* bf16 by truncation */
                    }
                }
            }
            r = mfsdp_backward_post(rt, u, mb);
        }
    }
    if (r == MFSDP_OK)
        r = mfsdp_step_end(rt);
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float c1 = 1.0f - powf(b1, (float)(step + 1)), c2 = 1.0f - powf(b2, (float)(step + 1));
    for (int k = 0; r == MFSDP_OK && k < nt; k++) {
        mfsdp_tensor_view x;
        mfsdp_tensor_view_get(rt, k, &x);
        float *w = x.main_weight;
        for (int64_t i = 0; i < x.shard_count; i++) {
            float g = x.grad_dtype == MFSDP_FP32 ? ((float *)x.grad)[i] : 0.0f;
            if (x.grad_dtype == MFSDP_BF16) {
                uint32_t b = (uint32_t)((uint16_t *)x.grad)[i] << 16;
                memcpy(&g, &b, 4);
            }
            m[k][i] = b1 * m[k][i] + (1.0f - b1) * g;
            v[k][i] = b2 * v[k][i] + (1.0f - b2) * g * g;
            w[i] -= lr * (m[k][i] / c1) / (sqrtf(v[k][i] / c2) + eps);
        }
    }
    return r;
}

static void ct_rank(ct_job *j)
{
    const ct_opts *o = j->o;
    mfsdp_runtime *rt = NULL;
    int nt = mfsdp_schedule_num_tensors(j->sh);
    float **m = calloc((size_t)nt, sizeof *m), **v = calloc((size_t)nt, sizeof *v);
    ct_blob blob = {0, 0x1234567ull};
    j->failed = 1;
    if (!m || !v) {
        snprintf(j->msg, sizeof j->msg, "out of memory");
        goto done;
    }
    CT_CHECK(mfsdp_create(j->sh, &j->cfg, &rt));
    j->cfg.rank = mfsdp_rank(rt);
    for (int k = 0; k < nt; k++) {
        mfsdp_tensor_view x;
        CT_CHECK(mfsdp_tensor_view_get(rt, k, &x));
        m[k] = calloc((size_t)x.shard_count + 1, sizeof(float));
        v[k] = calloc((size_t)x.shard_count + 1, sizeof(float));
        if (!m[k] || !v[k]) {
            snprintf(j->msg, sizeof j->msg, "out of memory");
            goto done;
        }
        for (int64_t i = 0; i < x.shard_count; i++)
            ((float *)x.main_weight)[i] = ct_init(x.name, x.shard_offset + i);
    }
    mfsdp_ckpt_state st[2] = {{"exp_avg", MFSDP_FP32, (void **)m}, {"exp_avg_sq", MFSDP_FP32, (void **)v}};
    if (o->import_hf) {
        mfsdp_hf_options ho = MFSDP_HF_OPTIONS_INIT;
        ho.nmaps = o->map ? 1 : 0, ho.maps = &o->map, ho.nties = o->tie ? 1 : 0, ho.ties = &o->tie;
        CT_CHECK(mfsdp_ckpt_import_hf(rt, o->import_hf, &ho));
    }
    mfsdp_ckpt_state swapped[2] = {st[1], st[0]};
    if (o->load) {
        mfsdp_ckpt_load_options lo = MFSDP_CKPT_LOAD_OPTIONS_INIT;
        lo.flags = o->verify_files ? MFSDP_CKPT_VERIFY_FILES : 0u, lo.nstates = o->weights_only ? 0 : 2;
        lo.states = j->cfg.rank == o->swap_states_rank ? swapped : st, lo.user_blob_rank = 0;
        lo.user_blob = &blob, lo.user_blob_capacity = sizeof blob;
        CT_CHECK(mfsdp_ckpt_load(rt, o->load, &lo));
        printf("bytes_read=%llu\n", (unsigned long long)lo.bytes_read);
        if (!o->weights_only && (lo.user_blob_bytes != sizeof blob || lo.step != blob.step)) {
            snprintf(j->msg, sizeof j->msg, "rank %lld: user blob of %zu bytes, step %lld vs %lld",
                     (long long)j->cfg.rank, lo.user_blob_bytes, (long long)lo.step, (long long)blob.step);
            goto done;
        }
    }
    for (int64_t s = 0; s < o->steps; s++) {
        CT_CHECK(ct_step(rt, j->sh, blob.step, m, v));
        blob.step++;
        blob.rng = blob.rng * 6364136223846793005ull + 1442695040888963407ull;
    }
    if (o->save) {
        pthread_t killer;
        if (o->kill_us >= 0 && j->cfg.rank == o->kill_rank)
            pthread_create(&killer, NULL, ct_kill, (void *)&o->kill_us);
        mfsdp_ckpt_save_options so = MFSDP_CKPT_SAVE_OPTIONS_INIT;
        so.step = blob.step, so.nstates = 2, so.states = st, so.user_blob = &blob, so.user_blob_bytes = sizeof blob;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CT_CHECK(mfsdp_ckpt_save(rt, o->save, &so));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (j->cfg.rank == 0)
            printf("save_us=%lld\n", (long long)((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000));
    }
    if (o->export_hf) {
        mfsdp_hf_options ho = MFSDP_HF_OPTIONS_INIT;
        ho.nmaps = o->map ? 1 : 0, ho.maps = &o->map, ho.nties = o->tie ? 1 : 0, ho.ties = &o->tie;
        mfsdp_dtype dt = !o->export_dtype || !strcmp(o->export_dtype, "fp32") ? MFSDP_FP32
                         : !strcmp(o->export_dtype, "bf16")                   ? MFSDP_BF16
                                                                               : MFSDP_FP16;
        CT_CHECK(mfsdp_ckpt_export_hf(rt, o->export_hf, dt, &ho, (uint64_t)o->export_max));
    }
    if (o->dump && ct_dump(rt, o->dump, m, v) != 0) {
        snprintf(j->msg, sizeof j->msg, "rank %lld: cannot write %s", (long long)j->cfg.rank, o->dump);
        goto done;
    }
    j->failed = 0;
done:
    mfsdp_destroy(rt);
    for (int k = 0; k < nt; k++) {
        if (m)
            free(m[k]);
        if (v)
            free(v[k]);
    }
    free(m);
    free(v);
}

static void *ct_thread(void *arg)
{
    ct_rank(arg);
    return NULL;
}

static int ct_usage(void)
{
    fprintf(stderr, "usage: ckpt-trainer --schedule S [--backend local|mpi] [--steps N] [--load DIR] "
                    "[--save DIR] [--dump FILE] [--kill-after-us US] [--kill-rank R] [--swap-states-rank R]\n");
    return 2;
}

int main(int argc, char **argv)
{
    ct_opts o = {.steps = 0, .kill_us = -1, .swap_states_rank = -1};
    /* Like a trainer that wants a failed save rather than death under a
     * file-size limit (tests/ckpt/xfsz.sh): the library reports EFBIG. */
    signal(SIGXFSZ, SIG_IGN);
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return ct_usage();
        if (!strcmp(a, "--schedule"))
            o.schedule = v;
        else if (!strcmp(a, "--backend"))
            o.mpi = !strcmp(v, "mpi");
        else if (!strcmp(a, "--steps"))
            o.steps = atoll(v);
        else if (!strcmp(a, "--load"))
            o.load = v;
        else if (!strcmp(a, "--save"))
            o.save = v;
        else if (!strcmp(a, "--dump"))
            o.dump = v;
        else if (!strcmp(a, "--kill-after-us"))
            o.kill_us = atoll(v);
        else if (!strcmp(a, "--import-hf"))
            o.import_hf = v;
        else if (!strcmp(a, "--map"))
            o.map = v;
        else if (!strcmp(a, "--tie"))
            o.tie = v;
        else if (!strcmp(a, "--export-hf"))
            o.export_hf = v;
        else if (!strcmp(a, "--export-dtype"))
            o.export_dtype = v;
        else if (!strcmp(a, "--export-max-file-bytes"))
            o.export_max = atoll(v);
        else if (!strcmp(a, "--verify-files"))
            o.verify_files = atoi(v);
        else if (!strcmp(a, "--weights-only"))
            o.weights_only = atoi(v);
        else if (!strcmp(a, "--all-errors"))
            o.all_errors = atoi(v);
        else if (!strcmp(a, "--swap-states-rank"))
            o.swap_states_rank = atoll(v);
        else if (!strcmp(a, "--kill-rank"))
            o.kill_rank = atoll(v);
        else
            return ct_usage();
    }
    if (!o.schedule)
        return ct_usage();
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(o.schedule, &sh) != MFSDP_OK) {
        fprintf(stderr, "ckpt-trainer: %s\n", mfsdp_last_error(NULL));
        return 2;
    }
    int64_t world = mfsdp_schedule_world_size(sh);
    int failed = 0;
    if (o.mpi) {
#ifdef CT_WITH_MPI
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        MPI_Comm comm = MPI_COMM_WORLD;
        ct_job j = {.sh = sh, .o = &o};
        mfsdp_config_init(&j.cfg);
        mfsdp_config_set_mpi(&j.cfg, &comm);
        j.cfg.timeout_ms = 60000;
        ct_rank(&j);
        if (j.failed)
            fprintf(stderr, "ckpt-trainer: %s\n", j.msg);
        int mine = j.failed, any = 0;
        MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        failed = any;
        MPI_Finalize();
#else
        fprintf(stderr, "ckpt-trainer: built without MPI\n");
        return 77;
#endif
    } else {
        mfsdp_local_group *g = NULL;
        ct_job *jobs = calloc((size_t)world, sizeof *jobs);
        pthread_t *th = calloc((size_t)world, sizeof *th);
        if (!jobs || !th || mfsdp_local_group_create(world, &g) != MFSDP_OK) {
            fprintf(stderr, "ckpt-trainer: cannot create the local group\n");
            return 2;
        }
        for (int64_t r = 0; r < world; r++) {
            jobs[r] = (ct_job){.sh = sh, .o = &o};
            mfsdp_config_init(&jobs[r].cfg);
            jobs[r].cfg.local_group = g;
            jobs[r].cfg.rank = r;
            jobs[r].cfg.timeout_ms = 60000;
            pthread_create(&th[r], NULL, ct_thread, &jobs[r]);
        }
        for (int64_t r = 0; r < world; r++) {
            pthread_join(th[r], NULL);
            if (jobs[r].failed) {
                if (!failed || o.all_errors)
                    fprintf(stderr, "ckpt-trainer: %s\n", jobs[r].msg);
                failed = 1;
            }
        }
        mfsdp_local_group_destroy(g);
        free(jobs);
        free(th);
    }
    mfsdp_schedule_free(sh);
    return failed;
}
