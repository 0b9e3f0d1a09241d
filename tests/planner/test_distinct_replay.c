/*
 * A schedule with a Distinct axis replayed by the runtime (local backend, 8
 * thread-ranks): tests/planner/distinct/ep_small.mfsdp, dense tensors data
 * parallel over the whole mesh dp_outer = 2 x ep = 2 x dp_inner = 2, experts
 * [Replicate, Distinct, Flat]. Each ep coordinate starts with its own expert
 * weights and each rank writes its own local gradients; the test checks, with
 * closed forms computed here and not by the code under test:
 *   - the unsharded expert weight every rank computes with is its own ep
 *     coordinate's (never the other coordinate's), the dense one the same
 *     everywhere;
 *   - the delivered expert gradient is the average over the 4 ranks sharing
 *     the rank's ep coordinate (reduce avg divides by the sizes of the axes
 *     reduced, dp_outer x dp_inner), summed over the microbatches; the dense
 *     one the average over all 8 ranks;
 *   - a native checkpoint writes the global tensors (the spec's `global`
 *     names, issue #42 item 2) with an optimizer state and loads both back
 *     bit for bit, on the same
 *     schedule and on ep_small_dp.mfsdp (the same ep size, other
 *     data-parallel sizes: dp_outer = 4 x ep = 2 x dp_inner = 1), each rank
 *     getting its own ep coordinate's experts; a Hugging Face export
 *     writes the global model (checked in detail by test_distinct_hf_rt).
 * Values are small integers over powers of two, exact in bf16 and fp32.
 *
 *   test_distinct_replay          8 thread-ranks (local backend), cmocka
 *   test_distinct_replay --mpi    one process per rank (mpirun -np 8), the
 *                                 same checks on the MPI backend
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mfsdp.h"
#include "mfsdp_ckpt.h"
#ifdef MFSDP_HAVE_MPI
#include "mfsdp_mpi.h"
#endif
#include "sched_test.h"

#define WORLD 8
#define EP_AXIS 1

static mfsdp_schedule *sched, *sched_dp; /* ep_small, ep_small_dp */
static char tmp_root[64];   /* a fresh directory under /tmp, the same on every rank */
static char ckpt_dir[96];   /* tmp_root/ckpt: the checkpoint (save creates it) */
static mfsdp_local_group *group;
static int64_t microbatches;

/* The initial master weight of element e of tensor t on ep coordinate c
 * (c = 0 for the dense tensors, which are the same tensor everywhere). */
static float w0(int t, int64_t e, int64_t c) { return (float)((t * 7 + e * 3 + c * 11) % 64 - 32); }

/* The local gradient rank r writes for element e of tensor t at microbatch m. */
static float g(int64_t r, int64_t m, int t, int64_t e) { return (float)((r * 5 + m * 13 + t * 3 + e) % 31 - 15); }

static bool is_expert(const char *name) { return strstr(name, ".experts.") != NULL; }

static int64_t ep_of(int64_t rank)
{
    return (rank / 2) % 2; /* row-major, dp_inner fastest: rank = 4 c_outer + 2 c_ep + c_inner */
}

static float bf16_to_float(const void *p, int64_t i)
{
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    int64_t bad;            /* mismatches */
    char first[256];        /* the first one */
} outcome;

static void mismatch(outcome *o, const char *fmt, ...)
{
    if (o->bad++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(o->first, sizeof o->first, fmt, ap);
        va_end(ap);
    }
}

/* The weights every rank computes with at a forward of unit u. */
static void check_weights(mfsdp_runtime *rt, int u, outcome *o)
{
    int64_t c = mfsdp_coord(rt, EP_AXIS);
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        if (v.unit != u)
            continue;
        for (int64_t e = 0; e < v.numel; e++)
            if (bf16_to_float(v.weight, e) != w0(t, e, is_expert(v.name) ? c : 0))
                mismatch(o, "rank %lld: %s[%lld] computes with %g, expected %g", (long long)mfsdp_rank(rt), v.name,
                         (long long)e, bf16_to_float(v.weight, e), w0(t, e, is_expert(v.name) ? c : 0));
    }
}

static void write_grads(mfsdp_runtime *rt, int u, int64_t m)
{
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        if (v.unit != u)
            continue;
        for (int64_t e = 0; e < v.numel; e++)
            ((float *)v.grad_local)[e] = g(mfsdp_rank(rt), m, t, e);
    }
}

/* The delivered gradient of this rank's shard against the closed form. */
static void check_grads(mfsdp_runtime *rt, outcome *o)
{
    int64_t me = mfsdp_rank(rt);
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        bool ex = is_expert(v.name);
        for (int64_t i = 0; i < v.shard_count; i++) {
            int64_t e = v.shard_offset + i;
            double sum = 0;
            int n = 0;
            for (int64_t r = 0; r < WORLD; r++) {
                if (ex && ep_of(r) != ep_of(me))
                    continue; /* another expert set: never mixed in */
                n++;
                for (int64_t m = 0; m < microbatches; m++)
                    sum += g(r, m, t, e);
            }
            float want = (float)(sum / n), got = ((const float *)v.grad)[i];
            if (got != want)
                mismatch(o, "rank %lld: %s[%lld] delivered %g, expected %g (average over %d ranks)", (long long)me,
                         v.name, (long long)e, got, want, n);
        }
    }
}

/* Every rank's main_weight shard against the initial weights of its ep
 * coordinate: 0 mismatches expected; `what` names the check. */
static void check_master(mfsdp_runtime *rt, const char *what, outcome *o)
{
    int64_t c = mfsdp_coord(rt, EP_AXIS);
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        for (int64_t i = 0; i < v.shard_count; i++) {
            float want = w0(t, v.shard_offset + i, is_expert(v.name) ? c : 0), got = ((float *)v.main_weight)[i];
            if (memcmp(&got, &want, sizeof got) != 0) {
                mismatch(o, "%s: rank %lld: %s[%lld] is %g, expected %g", what, (long long)mfsdp_rank(rt), v.name,
                         (long long)(v.shard_offset + i), got, want);
                return;
            }
        }
    }
}

/* The optimizer state (an Adam moment) of element e of tensor t on ep
 * coordinate c: other values than the weights, saved and loaded with them. */
static float s0(int t, int64_t e, int64_t c) { return w0(t, e, c) + 0.5f; }

/* Per tensor, a state shard of rt: s0's values (fill) or 1e9. */
static void **state_alloc(mfsdp_runtime *rt, bool fill)
{
    int64_t c = mfsdp_coord(rt, EP_AXIS);
    int n = mfsdp_num_tensors(rt);
    void **sh = calloc((size_t)n, sizeof *sh);
    for (int t = 0; sh && t < n; t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        float *f = v.shard_count ? malloc((size_t)v.shard_count * sizeof *f) : NULL;
        for (int64_t i = 0; f && i < v.shard_count; i++)
            f[i] = fill ? s0(t, v.shard_offset + i, is_expert(v.name) ? c : 0) : 1e9f;
        sh[t] = f;
    }
    return sh;
}

static void state_free(mfsdp_runtime *rt, void **sh)
{
    for (int t = 0; sh && t < mfsdp_num_tensors(rt); t++)
        free(sh[t]);
    free(sh);
}

/* Overwrites every main_weight shard, then loads ckpt_dir into rt, its
 * state `exp_avg` too, and checks both. */
static void load_back(mfsdp_runtime *rt, const char *what, outcome *o)
{
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        for (int64_t i = 0; i < v.shard_count; i++)
            ((float *)v.main_weight)[i] = 1e9f;
    }
    void **sh = state_alloc(rt, false);
    mfsdp_ckpt_state st = {"exp_avg", MFSDP_FP32, sh};
    mfsdp_ckpt_load_options lo = MFSDP_CKPT_LOAD_OPTIONS_INIT;
    lo.nstates = 1;
    lo.states = &st;
    mfsdp_result r = mfsdp_ckpt_load(rt, ckpt_dir, &lo);
    if (r != MFSDP_OK) {
        mismatch(o, "%s: load: result %d, %s", what, (int)r, mfsdp_last_error(rt));
    } else {
        check_master(rt, what, o);
        void **want = state_alloc(rt, true);
        for (int t = 0; want && t < mfsdp_num_tensors(rt); t++) {
            mfsdp_tensor_view v;
            mfsdp_tensor_view_get(rt, t, &v);
            if (v.shard_count && memcmp(sh[t], want[t], (size_t)v.shard_count * sizeof(float)) != 0) {
                mismatch(o, "%s: rank %lld: state exp_avg of %s differs after the load", what,
                         (long long)mfsdp_rank(rt), v.name);
                break;
            }
        }
        state_free(rt, want);
    }
    state_free(rt, sh);
}

/* The native checkpoint writes the global tensors and loads back on this
 * schedule; the Hugging Face export writes its file. */
static void check_ckpt(mfsdp_runtime *rt, outcome *o)
{
    void **sh = state_alloc(rt, true);
    mfsdp_ckpt_state st = {"exp_avg", MFSDP_FP32, sh};
    mfsdp_ckpt_save_options opt = MFSDP_CKPT_SAVE_OPTIONS_INIT;
    opt.nstates = 1;
    opt.states = &st;
    mfsdp_result r = mfsdp_ckpt_save(rt, ckpt_dir, &opt);
    state_free(rt, sh);
    if (r != MFSDP_OK)
        mismatch(o, "save: result %d, %s", (int)r, mfsdp_last_error(rt));
    else
        load_back(rt, "same schedule", o);
    char hf[80];
    snprintf(hf, sizeof hf, "%s/hf", tmp_root);
    r = mfsdp_ckpt_export_hf(rt, hf, MFSDP_FP32, NULL, 0); /* the global model (test_distinct_hf checks it) */
    if (r != MFSDP_OK)
        mismatch(o, "export: result %d, %s", (int)r, mfsdp_last_error(rt));
    char st_path[120];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", hf);
    FILE *f = fopen(st_path, "r");
    if (!f)
        mismatch(o, "the export wrote no %s", st_path);
    else
        fclose(f);
    /* a gather over the mesh of an expert (Distinct) tensor: refused, never mixed */
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        if (!is_expert(v.name))
            continue;
        float out[1];
        r = mfsdp_main_weight_gather(rt, t, out, MFSDP_FP32, 0);
        if (r != MFSDP_ERR_UNSUPPORTED || !strstr(mfsdp_last_error(rt), "mfsdp_main_weight_gather: tensor '") ||
            !strstr(mfsdp_last_error(rt), "is Distinct on axis 'ep'"))
            mismatch(o, "gather of %s: result %d, %s", v.name, (int)r, mfsdp_last_error(rt));
        break;
    }
}

/* One rank's step and checks on the runtime cfg selects. */
static void rank_run(const mfsdp_config *cfg, outcome *o)
{
    mfsdp_runtime *rt = NULL;
    if (mfsdp_create(sched, cfg, &rt) != MFSDP_OK) {
        mismatch(o, "create: %s", mfsdp_last_error(NULL));
        return;
    }
    int64_t c = mfsdp_coord(rt, EP_AXIS);
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        for (int64_t i = 0; i < v.shard_count; i++)
            ((float *)v.main_weight)[i] = w0(t, v.shard_offset + i, is_expert(v.name) ? c : 0);
    }
    int nu = mfsdp_schedule_num_units(sched);
    bool ok = mfsdp_step_begin(rt) == MFSDP_OK;
    for (int64_t m = 0; ok && m < microbatches; m++) {
        for (int u = 0; ok && u < nu; u++) {
            ok = mfsdp_forward_pre(rt, u, m) == MFSDP_OK;
            if (ok)
                check_weights(rt, u, o);
            ok = ok && mfsdp_forward_post(rt, u, m) == MFSDP_OK;
        }
        for (int u = nu - 1; ok && u >= 0; u--) {
            ok = mfsdp_backward_pre(rt, u, m) == MFSDP_OK;
            if (ok)
                write_grads(rt, u, m);
            ok = ok && mfsdp_backward_post(rt, u, m) == MFSDP_OK;
        }
    }
    ok = ok && mfsdp_step_end(rt) == MFSDP_OK;
    if (!ok)
        mismatch(o, "rank %lld: a hook failed: %s", (long long)mfsdp_rank(rt), mfsdp_last_error(rt));
    else
        check_grads(rt, o);
    if (ok)
        check_ckpt(rt, o);
    mfsdp_destroy(rt);
    /* the same global tensors on other data-parallel sizes */
    if (ok && mfsdp_create(sched_dp, cfg, &rt) != MFSDP_OK) {
        mismatch(o, "create (ep_small_dp): %s", mfsdp_last_error(NULL));
    } else if (ok) {
        load_back(rt, "ep_small_dp", o);
        mfsdp_destroy(rt);
    }
}

static void *rank_main(void *arg)
{
    mfsdp_config cfg = MFSDP_CONFIG_INIT;
    cfg.local_group = group;
    rank_run(&cfg, arg);
    return NULL;
}

/* Compiles tests/planner/distinct/NAME.mfsdp into *out (through its YAML,
 * as a trainer loads it); false with a message on stderr. */
static bool load_one(const char *name, mfsdp_schedule **out)
{
    char path[128];
    snprintf(path, sizeof path, "tests/planner/distinct/%s.mfsdp", name);
    char *spec = st_read(path, NULL), *diag = NULL, *yaml = NULL;
    mf_schedule *s = spec ? st_compile(path, spec, true, &diag) : NULL;
    size_t len = 0;
    bool ok = s && (yaml = st_emit(s, &len)) && mfsdp_schedule_load_buffer(path, yaml, len, out) == MFSDP_OK;
    if (!ok)
        fprintf(stderr, "%s: %s\n", path, !spec ? "cannot read it" : diag && *diag ? diag : mfsdp_last_error(NULL));
    free(yaml);
    free(diag);
    free(spec);
    mf_schedule_free(s);
    return ok;
}

/* ep_small into sched, ep_small_dp into sched_dp. */
static bool load_sched(void)
{
    if (!load_one("ep_small", &sched) || !load_one("ep_small_dp", &sched_dp))
        return false;
    microbatches = mfsdp_schedule_microbatches(sched);
    return true;
}

/* Removes the checkpoint directory (its files and the directory). */
static void remove_ckpt(void)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    if (tmp_root[0] && system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", tmp_root);
}

static void test_ep_replay(void **state)
{
    (void)state;
    assert_true(load_sched());
    snprintf(tmp_root, sizeof tmp_root, "/tmp/mfsdp_distinct_XXXXXX");
    assert_non_null(mkdtemp(tmp_root));
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", tmp_root);
    assert_int_equal(mfsdp_schedule_world_size(sched), WORLD);
    assert_string_equal(mfsdp_schedule_axis_name(sched, EP_AXIS), "ep");
    assert_int_equal(mfsdp_local_group_create(WORLD, &group), MFSDP_OK);
    pthread_t th[WORLD];
    outcome out[WORLD];
    memset(out, 0, sizeof out);
    for (int r = 0; r < WORLD; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &out[r]), 0);
    for (int r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < WORLD; r++)
        if (out[r].bad)
            fail_msg("%lld mismatches; first: %s", (long long)out[r].bad, out[r].first);
    remove_ckpt();
    mfsdp_local_group_destroy(group);
    mfsdp_schedule_free(sched);
    mfsdp_schedule_free(sched_dp);
}

#ifdef MFSDP_HAVE_MPI
static int run_mpi(int *argc, char ***argv)
{
    int provided = 0, me = 0, world = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm comm = MPI_COMM_WORLD;
    outcome o = {0};
    if (world != WORLD)
        mismatch(&o, "needs %d ranks (have %d)", WORLD, world);
    else if (!load_sched())
        mismatch(&o, "cannot load the schedule");
    else {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/mfsdp_distinct_XXXXXX");
        if (me == 0 && !mkdtemp(tmp_root))
            tmp_root[0] = '\0';
        MPI_Bcast(tmp_root, sizeof tmp_root, MPI_CHAR, 0, MPI_COMM_WORLD);
        snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", tmp_root);
        mfsdp_config cfg;
        mfsdp_config_init(&cfg);
        mfsdp_config_set_mpi(&cfg, &comm);
        cfg.timeout_ms = 60000;
        rank_run(&cfg, &o);
        MPI_Barrier(MPI_COMM_WORLD);
        if (me == 0)
            remove_ckpt();
        mfsdp_schedule_free(sched);
        mfsdp_schedule_free(sched_dp);
    }
    if (o.bad)
        fprintf(stderr, "rank %d: %lld mismatches; first: %s\n", me, (long long)o.bad, o.first);
    int64_t all = 0;
    MPI_Allreduce(&o.bad, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0 && all == 0)
        printf("test_distinct_replay --mpi: weights and delivered gradients per ep coordinate on %d ranks\n", world);
    MPI_Finalize();
    return all != 0;
}
#endif

int main(int argc, char **argv)
{
#ifdef MFSDP_HAVE_MPI
    if (argc >= 2 && !strcmp(argv[1], "--mpi"))
        return run_mpi(&argc, &argv);
#endif
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ep_replay)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
