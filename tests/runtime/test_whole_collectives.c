/*
 * test_whole_collectives: the collectives of a whole bucket (docs/runtime.md,
 * "Whole buckets") in the prefix form against the padded form.
 *
 * Hand-built schedules (the test builder, then the bucket's one tensor
 * replaced by uneven tensors packed inside the shards of the whole roles, and
 * grad and main_weight marked whole), with hand-written ops issued at
 * step_begin on one stream:
 *
 *   1-D, 4 ranks, weight/grad/main [F]/[F]/[F] (grad_local reduced into
 *     grad [F]), shards of S = 128 elements: shard 0: a[80]; shard 1: b[20]
 *     at 0, c[14] at 32 (a gap); shard 2: empty; shard 3: d[66]. Used
 *     prefixes 80, 46, 0, 66; the whole bucket's used prefix 3 S + 66 = 450
 *     of 512.
 *     ops: reduce_scatter grad_local -> grad, all_gather grad -> weight_full,
 *          all_reduce grad_local in place (a [Partial] shard: the bucket).
 *   2x2, [R,F]/[P,F]/[R,F], shards of 256 (along the inner axis): shard 0:
 *     a[100], b[26]; shard 1: c[40]. Used 126 and 40.
 *     ops: reduce_scatter on the inner axis grad_local -> grad, all_reduce on
 *          the outer axis of grad in place (every member holds one shard),
 *          all_gather on the inner axis grad -> weight_full.
 *
 * Each case runs once per form (MFSDP_WHOLE_COLLECTIVES=padded, =prefix,
 * unset) on the same inputs: non-integer values whose sums round at tensor
 * elements, zero at padding and gaps (the invariant), destinations filled
 * with garbage first. The forms' buffers must be equal bit for bit, every
 * element outside a tensor zero (so a receiver that does not zero-fill its
 * padding fails), the prefix tables the hand-worked prefixes and the bytes
 * counted per rank the model's (docs/runtime.md). Scales 1 (eager local
 * collectives), 64 (rendezvous) and 8192 (streaming stores, push all-gather);
 * fp32 and bf16; sum and avg. Then a bad MFSDP_WHOLE_COLLECTIVES is refused
 * at create, naming the variable and its values.
 *
 *   test_whole_collectives          the local backend (4 thread-ranks), cmocka
 *   test_whole_device               this file built with WC_DEVICE (tests/gpu):
 *                                   the same on cuda-local, 4 thread-ranks on
 *                                   one GPU (buffers through the stage hook);
 *                                   exits 77 without a GPU
 *   test_whole_collectives --mpi    one process per rank (mpirun -np 4), the
 *                                   padded and prefix forms in the same
 *                                   processes, bit for bit too (Open MPI
 *                                   4.1's libnbc; docs/runtime.md says where
 *                                   another MPI could pair sums differently)
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

#include "rt_testlib.h"
#ifdef WC_DEVICE
#include "gpu_presence.h"
#include "mfsdp_nccl.h"
#undef MFSDP_HAVE_MPI   /* the device variant runs cuda-local only */
#endif
#ifdef MFSDP_HAVE_MPI
#include "mfsdp_mpi.h"
#endif

#define WC_MAXT 4
#define WC_OPS 3
#define WC_RANKS 4

typedef enum { WC_CHUNKS, WC_BUCKET, WC_MINE } wc_usedkind;

typedef struct wc_op {
    mf_opkind kind;
    int axis;
    mf_bufkind src, dst;
    int per_shard;            /* count = L / per_shard */
    wc_usedkind used;         /* chunk c: shard c's prefix; all the bucket's; all my shard's */
} wc_op;

typedef struct wc_case {
    const char *name;
    int naxes;
    int64_t sizes[2];
    const char *place[MF_ROLE_COUNT];
    int64_t length;           /* L at scale 1 */
    int64_t shards;           /* of the whole roles */
    int ntensors;
    int64_t at[WC_MAXT], numel[WC_MAXT];
    int64_t used[WC_RANKS];   /* per shard, at scale 1 */
    int64_t bucket_used;      /* furthest tensor element, at scale 1 */
    wc_op ops[WC_OPS];
} wc_case;

static const wc_case CASES[] = {
    {"1-D x4", 1, {4}, {"F", "F", "F"}, 512, 4, 4, {0, 128, 160, 384}, {80, 20, 14, 66},
     {80, 46, 0, 66}, 450,
     {{MF_OP_REDUCE_SCATTER, 0, MF_BUF_GRAD_LOCAL, MF_BUF_GRAD, 4, WC_CHUNKS},
      {MF_OP_ALL_GATHER, 0, MF_BUF_GRAD, MF_BUF_WEIGHT_FULL, 4, WC_CHUNKS},
      {MF_OP_ALL_REDUCE, 0, MF_BUF_GRAD_LOCAL, MF_BUF_GRAD_LOCAL, 1, WC_BUCKET}}},
    {"2x2", 2, {2, 2}, {"RF", "PF", "RF"}, 512, 2, 3, {0, 100, 256}, {100, 26, 40}, {126, 40}, 296,
     {{MF_OP_REDUCE_SCATTER, 1, MF_BUF_GRAD_LOCAL, MF_BUF_GRAD, 2, WC_CHUNKS},
      {MF_OP_ALL_REDUCE, 0, MF_BUF_GRAD, MF_BUF_GRAD, 2, WC_MINE},
      {MF_OP_ALL_GATHER, 1, MF_BUF_GRAD, MF_BUF_WEIGHT_FULL, 2, WC_CHUNKS}}},
};

static const char *const TNAMES[WC_MAXT] = {"u.a", "u.b", "u.c", "u.d"};

/* Builds case c at `scale` (offsets, sizes and shards times scale). */
static mfsdp_schedule *wc_schedule(const wc_case *c, int64_t scale, mf_dtype dt, mf_reduce red,
                                   char *err, size_t errlen)
{
    mf_tb_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.naxes = c->naxes;
    for (int j = 0; j < c->naxes; j++)
        spec.sizes[j] = c->sizes[j];
    spec.microbatches = 1;
    spec.reduce = red;
    spec.nlayouts = 1;
    spec.layouts[0] = (mf_tb_layout){{dt, dt, MF_FP32}, {c->place[0], c->place[1], c->place[2]}};
    int64_t L = c->length * scale;
    spec.nunits = 1;
    spec.units[0] = (mf_tb_unit){"u", false, 1, {{"t", L, 0}}};
    mf_schedule *s = mf_tb_build(&spec, err, errlen);
    if (!s)
        return NULL;
    if (s->buckets[0].length != L) {
        snprintf(err, errlen, "the bucket is padded to %lld", (long long)s->buckets[0].length);
        mf_schedule_free(s);
        return NULL;
    }
    mf_bucket *b = &s->buckets[0];
    mf_tensor *t = mf_arena_array(s->arena, WC_MAXT, sizeof *t);
    for (int k = 0; k < c->ntensors; k++)
        t[k] = (mf_tensor){.name = TNAMES[k], .ndims = 1, .dims = {c->numel[k] * scale},
                           .numel = c->numel[k] * scale, .offset = c->at[k] * scale};
    b->tensors = t;
    b->ntensors = c->ntensors;
    b->used = c->bucket_used * scale;
    b->whole[MF_ROLE_GRAD] = b->whole[MF_ROLE_MAIN_WEIGHT] = true;
    int buf[MF_BUFKIND_COUNT];
    for (int k = 0; k < MF_BUFKIND_COUNT; k++)
        buf[k] = -1;
    for (int i = 0; i < s->nbuffers; i++)
        buf[s->buffers[i].kind] = i;
    mf_op *ops = mf_arena_array(s->arena, WC_OPS + 2, sizeof *ops);
    for (int k = 0; k < WC_OPS; k++) {
        const wc_op *o = &c->ops[k];
        ops[k] = (mf_op){.id = k, .phase = MF_PHASE_STEP_BEGIN, .unit = -1, .when = MF_WHEN_EVERY,
                         .stream = MF_STREAM_INNER, .kind = o->kind, .bucket = 0, .axis = o->axis,
                         .dtype = dt, .count = L / o->per_shard, .src = buf[o->src],
                         .dst = buf[o->dst], .event = -1};
    }
    mf_tb_step_begin_fence(ops, WC_OPS);
    s->ops = ops;
    s->nops = WC_OPS + 2;
    s->nevents = 1;
    mf_schedule_summarize(s);
    mfsdp_schedule *h = NULL;
    if (mf_rt_schedule_wrap(s, &h, err, errlen) != MFSDP_OK)
        return NULL;
    return h;
}

/* Rank r's gradient element at bucket index i: mixed magnitudes whose sums round. */
static float input(int64_t r, int64_t i)
{
    unsigned h = (unsigned)(i * 2654435761u) ^ (unsigned)(r * 40503u + 17u);
    return (float)(h % 100003u) / 997.0f * (float)(1 + (h >> 20) % 7) - 50.0f;
}

static bool in_tensor(const mf_bucket *b, int64_t i)
{
    for (int k = 0; k < b->ntensors; k++)
        if (i >= b->tensors[k].offset && i < b->tensors[k].offset + b->tensors[k].numel)
            return true;
    return false;
}

/* What one rank's run leaves: the three buffers the ops write or read. */
typedef struct wc_out {
    char *buf[WC_OPS];
    size_t bytes[WC_OPS];
    int64_t stat_bytes[MF_MAX_AXES];
    char err[512];
} wc_out;

static const mf_bufkind KEPT[WC_OPS] = {MF_BUF_GRAD_LOCAL, MF_BUF_GRAD, MF_BUF_WEIGHT_FULL};

static int buffer_of(const mf_schedule *s, mf_bufkind k)
{
    for (int i = 0; i < s->nbuffers; i++)
        if (s->buffers[i].kind == k)
            return i;
    return -1;
}

#define WC_CHECK(cond, ...)                                   \
    do {                                                      \
        if (!(cond)) {                                        \
            snprintf(o->err, sizeof o->err, __VA_ARGS__);     \
            goto out;                                         \
        }                                                     \
    } while (0)

/* The used prefixes and bytes the schedule's ops must have on this rank in
 * the prefix form, from the hand-worked table. */
static bool check_tables(const mf_rt *rt, const wc_case *c, int64_t scale, bool prefix,
                         int64_t want_bytes[MF_MAX_AXES], char *err, size_t errlen)
{
    memset(want_bytes, 0, sizeof(int64_t) * MF_MAX_AXES);
    for (int k = 0; k < WC_OPS; k++) {
        const mf_rt_op *r = &rt->rops[k];
        const wc_op *w = &c->ops[k];
        int64_t n = r->nranks, me = r->coord, es = (int64_t)mf_dtype_size(r->op->dtype);
        int64_t want[WC_RANKS], sum = 0;
        for (int64_t q = 0; q < n; q++) {
            want[q] = w->used == WC_CHUNKS ? c->used[q] * scale
                      : w->used == WC_BUCKET ? c->bucket_used * scale
                                             : c->used[rt->coords[1]] * scale;
            sum += want[q];
        }
        if (!prefix) {
            if (r->used) {
                snprintf(err, errlen, "op %d: a prefix table in the padded form", k);
                return false;
            }
            want_bytes[w->axis] += mf_schedule_collective_bytes(w->kind, n, r->op->count, r->op->dtype);
            continue;
        }
        if (!r->used) {
            snprintf(err, errlen, "op %d (%s): no prefix table in the prefix form", k,
                     mf_opkind_name(w->kind));
            return false;
        }
        for (int64_t q = 0; q < n; q++)
            if (r->used[q] != want[q]) {
                snprintf(err, errlen, "op %d (%s): chunk %lld's used prefix is %lld, not %lld", k,
                         mf_opkind_name(w->kind), (long long)q, (long long)r->used[q],
                         (long long)want[q]);
                return false;
            }
        /* docs/semantics.md §6.1 for one rank: every other member's prefix, sent
         * (reduce_scatter) or received (all_gather); a ring all-reduce of its own */
        want_bytes[w->axis] += w->kind == MF_OP_ALL_REDUCE ? 2 * (n - 1) * ((want[me] + n - 1) / n) * es
                                                           : (sum - want[me]) * es;
    }
    return true;
}

/* One rank: create, fill, one step, keep the buffers, check the tables. */
static void wc_rank(const mfsdp_schedule *sh, const wc_case *c, int64_t scale, bool prefix,
                    const mfsdp_config *cfg0, wc_out *o)
{
    mfsdp_config cfg = *cfg0;
    mfsdp_runtime *rt = NULL;
    const mf_schedule *s = sh->s;
    const mf_bucket *b = &s->buckets[0];
    char why[400];
    o->err[0] = '\0';
    WC_CHECK(mfsdp_create(sh, &cfg, &rt) == MFSDP_OK, "create: %s", mfsdp_last_error(NULL));
    int64_t want[MF_MAX_AXES];
    WC_CHECK(check_tables(rt, c, scale, prefix, want, why, sizeof why), "%s", why);
    /* Buffers are reached through the backend's stage hook (device memory on cuda-local). */
    for (int k = 0; k < WC_OPS; k++) {
        int bi = buffer_of(s, KEPT[k]);
        const mf_buffer *bf = &s->buffers[bi];
        size_t bes = mf_dtype_size(bf->dtype), bytes = (size_t)bf->count * bes;
        char *host = malloc(bytes);
        WC_CHECK(host, "out of memory");
        memset(host, 0xa5, bytes);   /* garbage where the ops write */
        for (int64_t i = 0; k == 0 && i < bf->count; i++) {   /* grad_local: [Partial], the bucket */
            float x = in_tensor(b, i) ? input(rt->rank, i) : 0.0f;
            uint16_t h = mf_dtype_f32_to_bf16(x);
            memcpy(host + (size_t)i * bes, bes == 4 ? (const void *)&x : (const void *)&h, bes);
        }
        bool ok = rt->be->stage(rt, mf_rt_buffer(rt, bi), host, bytes, why, sizeof why) == MFSDP_OK;
        free(host);
        WC_CHECK(ok, "stage in: %s", why);
    }
    mfsdp_result r = mfsdp_step_begin(rt);
    if (r == MFSDP_OK)
        r = mfsdp_forward_pre(rt, 0, 0);
    if (r == MFSDP_OK)
        r = mfsdp_forward_post(rt, 0, 0);
    if (r == MFSDP_OK)
        r = mfsdp_backward_pre(rt, 0, 0);
    if (r == MFSDP_OK)
        r = mfsdp_backward_post(rt, 0, 0);
    if (r == MFSDP_OK)
        r = mfsdp_step_end(rt);
    if (r == MFSDP_OK)
        r = mfsdp_synchronize(rt);   /* native backends: step_end does not wait */
    WC_CHECK(r == MFSDP_OK, "step: %s", mfsdp_last_error(rt));
    mfsdp_stats st;
    WC_CHECK(mfsdp_get_stats(rt, &st) == MFSDP_OK, "stats");
    for (int j = 0; j < s->mesh.naxes; j++) {
        o->stat_bytes[j] = st.bytes[j];
        WC_CHECK(st.bytes[j] == want[j], "axis %d: %lld bytes counted, the %s form's model says %lld",
                 j, (long long)st.bytes[j], prefix ? "prefix" : "padded", (long long)want[j]);
    }
    for (int k = 0; k < WC_OPS; k++) {
        int bi = buffer_of(s, KEPT[k]);
        const mf_buffer *bf = &s->buffers[bi];
        size_t bes = mf_dtype_size(bf->dtype);
        o->bytes[k] = (size_t)bf->count * bes;
        o->buf[k] = malloc(o->bytes[k]);
        WC_CHECK(o->buf[k], "out of memory");
        WC_CHECK(rt->be->stage(rt, o->buf[k], mf_rt_buffer(rt, bi), o->bytes[k], why, sizeof why) == MFSDP_OK,
                 "stage out: %s", why);
        mf_range rg = mf_layout_bucket_range(&s->mesh, b, &bf->place, rt->rank);
        for (int64_t i = 0; i < bf->count; i++) {
            static const char zero[4];
            WC_CHECK(in_tensor(b, rg.offset + i) || !memcmp(o->buf[k] + (size_t)i * bes, zero, bes),
                     "%s: element %lld (bucket %lld) is padding but not zero", bf->name, (long long)i,
                     (long long)(rg.offset + i));
        }
    }
out:
    mfsdp_destroy(rt);
}

static void wc_free(wc_out *o)
{
    for (int k = 0; k < WC_OPS; k++) {
        free(o->buf[k]);
        o->buf[k] = NULL;
    }
}

/* The padded run's buffer k equals another form's, bit for bit. */
static bool wc_same(const wc_out *a, const wc_out *b, int k)
{
    return a->bytes[k] == b->bytes[k] && memcmp(a->buf[k], b->buf[k], a->bytes[k]) == 0;
}

/* ---- the local backend (or cuda-local, WC_DEVICE): 4 thread-ranks ---- */

static void wc_config(mfsdp_config *cfg, mfsdp_local_group *g, int64_t rank)
{
    mfsdp_config_init(cfg);
#ifdef WC_DEVICE
    mfsdp_config_set_cuda_local(cfg, g, NULL);
#endif
    cfg->local_group = g;
    cfg->rank = rank;
    cfg->timeout_ms = 30000;
}

typedef struct wc_job {
    const mfsdp_schedule *sh;
    const wc_case *c;
    int64_t scale;
    bool prefix;
    mfsdp_config cfg;
    wc_out out;
} wc_job;

static void *wc_thread(void *p)
{
    wc_job *j = p;
    wc_rank(j->sh, j->c, j->scale, j->prefix, &j->cfg, &j->out);
    return NULL;
}

/* Runs all ranks of case c in one form (env: MFSDP_WHOLE_COLLECTIVES or NULL). */
static void run_local(const mfsdp_schedule *sh, const wc_case *c, int64_t scale, const char *env,
                      wc_job jobs[WC_RANKS])
{
    if (env)
        setenv("MFSDP_WHOLE_COLLECTIVES", env, 1);
    else
        unsetenv("MFSDP_WHOLE_COLLECTIVES");
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(WC_RANKS, &g), MFSDP_OK);
    pthread_t th[WC_RANKS];
    for (int r = 0; r < WC_RANKS; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r] = (wc_job){.sh = sh, .c = c, .scale = scale, .prefix = !env || !strcmp(env, "prefix")};
        wc_config(&jobs[r].cfg, g, r);
        assert_int_equal(pthread_create(&th[r], NULL, wc_thread, &jobs[r]), 0);
    }
    for (int r = 0; r < WC_RANKS; r++)
        pthread_join(th[r], NULL);
    mfsdp_local_group_destroy(g);
    unsetenv("MFSDP_WHOLE_COLLECTIVES");
    for (int r = 0; r < WC_RANKS; r++)
        if (jobs[r].out.err[0])
            fail_msg("%s, scale %lld, %s form, rank %d: %s", c->name, (long long)scale,
                     env ? env : "default", r, jobs[r].out.err);
}

static void local_case(const wc_case *c, int64_t scale, mf_dtype dt, mf_reduce red)
{
    char err[512];
    mfsdp_schedule *sh = wc_schedule(c, scale, dt, red, err, sizeof err);
    if (!sh)
        fail_msg("%s: %s", c->name, err);
    static wc_job padded[WC_RANKS], prefix[WC_RANKS], deflt[WC_RANKS];
    run_local(sh, c, scale, "padded", padded);
    run_local(sh, c, scale, "prefix", prefix);
    run_local(sh, c, scale, NULL, deflt);   /* every op has padding: prefix */
    for (int r = 0; r < WC_RANKS; r++)
        for (int k = 0; k < WC_OPS; k++)
            if (!wc_same(&padded[r].out, &prefix[r].out, k) ||
                !wc_same(&padded[r].out, &deflt[r].out, k))
                fail_msg("%s, scale %lld, %s: rank %d's %s differs between the forms", c->name,
                         (long long)scale, mf_dtype_name(dt), r, mf_bufkind_name(KEPT[k]));
    for (int r = 0; r < WC_RANKS; r++) {
        wc_free(&padded[r].out);
        wc_free(&prefix[r].out);
        wc_free(&deflt[r].out);
    }
    mfsdp_schedule_free(sh);
}

static void test_1d_forms(void **state)
{
    (void)state;
    local_case(&CASES[0], 1, MF_FP32, MF_REDUCE_SUM);    /* eager */
    local_case(&CASES[0], 64, MF_FP32, MF_REDUCE_SUM);   /* rendezvous */
    local_case(&CASES[0], 64, MF_BF16, MF_REDUCE_AVG);
    local_case(&CASES[0], 8192, MF_FP32, MF_REDUCE_SUM); /* streaming stores, push */
}

static void test_2x2_forms(void **state)
{
    (void)state;
    local_case(&CASES[1], 1, MF_FP32, MF_REDUCE_SUM);
    local_case(&CASES[1], 64, MF_FP32, MF_REDUCE_AVG);
    local_case(&CASES[1], 64, MF_BF16, MF_REDUCE_SUM);
}

static void test_bad_env(void **state)
{
    (void)state;
    char err[512];
    mfsdp_schedule *sh = wc_schedule(&CASES[0], 1, MF_FP32, MF_REDUCE_SUM, err, sizeof err);
    if (!sh)
        fail_msg("%s", err);
    setenv("MFSDP_WHOLE_COLLECTIVES", "ring", 1);
    wc_job jobs[WC_RANKS];
    mfsdp_local_group *g4 = NULL;
    assert_int_equal(mfsdp_local_group_create(WC_RANKS, &g4), MFSDP_OK);
    pthread_t th[WC_RANKS];
    for (int r = 0; r < WC_RANKS; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r] = (wc_job){.sh = sh, .c = &CASES[0], .scale = 1, .prefix = true};
        wc_config(&jobs[r].cfg, g4, r);
        assert_int_equal(pthread_create(&th[r], NULL, wc_thread, &jobs[r]), 0);
    }
    for (int r = 0; r < WC_RANKS; r++)
        pthread_join(th[r], NULL);
    unsetenv("MFSDP_WHOLE_COLLECTIVES");
    mfsdp_local_group_destroy(g4);
    for (int r = 0; r < WC_RANKS; r++) {
        if (!strstr(jobs[r].out.err, "create: MFSDP_WHOLE_COLLECTIVES=ring: expected padded or prefix"))
            fail_msg("rank %d: %s", r, jobs[r].out.err[0] ? jobs[r].out.err : "created");
        wc_free(&jobs[r].out);
    }
    mfsdp_schedule_free(sh);
}

/* ---- MPI: one process per rank ---- */

#ifdef MFSDP_HAVE_MPI
static int run_mpi(int *argc, char ***argv)
{
    int provided = 0, me = 0, world = 0, bad = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm comm = MPI_COMM_WORLD;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_mpi(&cfg, &comm);
    cfg.timeout_ms = 60000;
    struct {
        int c;
        int64_t scale;
        mf_dtype dt;
        mf_reduce red;
    } runs[] = {{0, 1, MF_FP32, MF_REDUCE_SUM},  {0, 64, MF_FP32, MF_REDUCE_SUM},
                {0, 64, MF_BF16, MF_REDUCE_AVG}, {0, 8192, MF_FP32, MF_REDUCE_SUM},
                {1, 1, MF_FP32, MF_REDUCE_SUM},  {1, 64, MF_FP32, MF_REDUCE_AVG},
                {1, 64, MF_BF16, MF_REDUCE_SUM}};
    for (size_t i = 0; world == WC_RANKS && i < sizeof runs / sizeof runs[0]; i++) {
        const wc_case *c = &CASES[runs[i].c];
        char err[512];
        mfsdp_schedule *sh = wc_schedule(c, runs[i].scale, runs[i].dt, runs[i].red, err, sizeof err);
        wc_out padded = {0}, prefix = {0};
        if (!sh) {
            fprintf(stderr, "rank %d: %s: %s\n", me, c->name, err);
            bad = 1;
        } else {
            setenv("MFSDP_WHOLE_COLLECTIVES", "padded", 1);
            wc_rank(sh, c, runs[i].scale, false, &cfg, &padded);
            setenv("MFSDP_WHOLE_COLLECTIVES", "prefix", 1);
            wc_rank(sh, c, runs[i].scale, true, &cfg, &prefix);
            unsetenv("MFSDP_WHOLE_COLLECTIVES");
            const char *e = padded.err[0] ? padded.err : prefix.err;
            if (e[0]) {
                fprintf(stderr, "rank %d: %s scale %lld: %s\n", me, c->name, (long long)runs[i].scale, e);
                bad = 1;
            }
            for (int k = 0; k < WC_OPS && !e[0]; k++) {
                if (!wc_same(&padded, &prefix, k)) {
                    fprintf(stderr, "rank %d: %s scale %lld %s: %s differs between the forms\n", me,
                            c->name, (long long)runs[i].scale, mf_dtype_name(runs[i].dt),
                            mf_bufkind_name(KEPT[k]));
                    bad = 1;
                }
            }
        }
        wc_free(&padded);
        wc_free(&prefix);
        mfsdp_schedule_free(sh);
    }
    if (world != WC_RANKS && me == 0)
        fprintf(stderr, "test_whole_collectives --mpi: needs %d ranks (have %d)\n", WC_RANKS, world);
    int any = 0;
    bad |= world != WC_RANKS;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (me == 0 && !any)
        printf("test_whole_collectives --mpi: prefix form equals the padded form on 4 ranks (1-D, 2x2)\n");
    MPI_Finalize();
    return any;
}
#endif

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--mpi")) {
#ifdef MFSDP_HAVE_MPI
        return run_mpi(&argc, &argv);
#else
        fprintf(stderr, "built without MPI\n");
        return 1;
#endif
    }
#ifdef WC_DEVICE
    int gpu = gpu_presence();
    if (gpu != GPU_PRESENT)
        return gpu;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_1d_forms),
        cmocka_unit_test(test_2x2_forms),
        cmocka_unit_test(test_bad_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
