/*
 * test_offload: MFSDP_FLAG_OFFLOAD_MAIN (engine/mf_offload.c; the section
 * "CPU offload" of docs/runtime.md §6). The placement decision and the host block's layout on every compiled
 * example schedule (none is refused: each casts from main_weight first) and
 * on schedules made to run a collective on a main_weight buffer (refused,
 * naming the op); the flag on the local backend, where it is a no-op (the
 * views, the memory figures and the master weights' bits are those of a run
 * without it, and the runtime says why); and the active path itself on the
 * CPU through mf_offload_fake_host_alloc (the main weights in a block of
 * their own, the gradient views in its mirror, filled at step_end): the
 * oracle passes and the master weights are bit-identical to a run without
 * the flag.
 *
 *   test_offload DIR     (DIR: the compiled schedules of the rt_schedules fixture)
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mf_check.h"
#include "mf_offload.h"
#include "mf_rt.h"
#include "rt_testlib.h"

static const char *g_dir;

static mfsdp_schedule *load(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK)
        fail_msg("%s: %s", path, mfsdp_last_error(NULL));
    return sh;
}

static int64_t bytes_of(const mf_buffer *b)
{
    return b->count * (int64_t)mf_dtype_size(b->dtype);
}

/* The layout's properties: main_weight buffers first, then one delivered
 * gradient per bucket (grad_final, else grad), nothing else, aligned and
 * disjoint. */
static void check_layout(const mf_schedule *s, const char *name)
{
    int64_t *off = calloc((size_t)s->nbuffers, sizeof *off);
    assert_non_null(off);
    int64_t mains = -1, grads = -1;
    int64_t total = mf_offload_layout(s, off, &mains, &grads);
    assert_int_equal(total, mains + grads);
    for (int b = 0; b < s->nbuffers; b++) {
        const mf_buffer *bf = &s->buffers[b];
        bool fin = false, grad_only = bf->kind == MF_BUF_GRAD;
        for (int c = 0; c < s->nbuffers; c++)
            if (s->buffers[c].bucket == bf->bucket && s->buffers[c].kind == MF_BUF_GRAD_FINAL)
                fin = true;
        bool want = bf->kind == MF_BUF_MAIN_WEIGHT || bf->kind == MF_BUF_GRAD_FINAL || (grad_only && !fin);
        if (!want) {
            assert_int_equal(off[b], -1);
            continue;
        }
        if (off[b] < 0)
            fail_msg("%s: buffer %s has no place in the host block", name, bf->name);
        assert_int_equal(off[b] % s->align, 0);
        if (bf->kind == MF_BUF_MAIN_WEIGHT)
            assert_true(off[b] + bytes_of(bf) <= mains);
        else
            assert_true(off[b] >= mains && off[b] + bytes_of(bf) <= total);
        for (int c = 0; c < b; c++)
            if (off[c] >= 0 && off[c] < off[b] + bytes_of(bf) && off[b] < off[c] + bytes_of(&s->buffers[c]))
                fail_msg("%s: %s and %s overlap in the host block", name, bf->name, s->buffers[c].name);
    }
    free(off);
}

/* Every example schedule: accepted for offload on a GPU, a no-op on a CPU. */
static void test_decide_examples(void **state)
{
    (void)state;
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".yaml") != 0)
            continue;
        mfsdp_schedule *sh = load(e->d_name);
        const mf_schedule *s = sh->s;
        int op = 7;
        assert_int_equal(mfsdp_schedule_offload_op(sh), -1);
        assert_int_equal(mf_offload_decide(s, 0, true, &op), MF_OFFLOAD_OFF);
        assert_int_equal(op, -1);
        assert_int_equal(mf_offload_decide(s, MFSDP_FLAG_OFFLOAD_MAIN, false, &op), MF_OFFLOAD_NOOP);
        assert_int_equal(mf_offload_decide(s, MFSDP_FLAG_OFFLOAD_MAIN | MFSDP_FLAG_SYNCHRONOUS, true, &op),
                         MF_OFFLOAD_ACTIVE);
        assert_int_equal(op, -1);
        check_layout(s, e->d_name);
        mfsdp_schedule_free(sh);
        n++;
    }
    closedir(d);
    assert_true(n >= 15);   /* the twelve examples and the test specs */
}

/* hfsdp's host block by hand: main_weight embed 8064, 4 x layers 6656, 4 x
 * norms 256, head 8064 fp32 elements (each a multiple of 256 bytes), and a
 * grad_final of the same counts per bucket. */
static void test_layout_hfsdp(void **state)
{
    (void)state;
    mfsdp_schedule *sh = load("hfsdp.yaml");
    int64_t *off = calloc((size_t)sh->s->nbuffers, sizeof *off);
    int64_t mains = 0, grads = 0;
    int64_t want = 4 * (8064 + 4 * 6656 + 4 * 256 + 8064);
    assert_int_equal(mf_offload_layout(sh->s, off, &mains, &grads), 2 * want);
    assert_int_equal(mains, want);
    assert_int_equal(grads, want);
    free(off);
    mfsdp_schedule_free(sh);
}

static int find_op(const mf_schedule *s, mf_opkind kind, bool src_is_weight_stage)
{
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == kind && s->ops[i].src >= 0 &&
            (!src_is_weight_stage || s->buffers[s->ops[i].src].kind != MF_BUF_WEIGHT))
            return i;
    return -1;
}

static int main_of(const mf_schedule *s, int bucket)
{
    for (int b = 0; b < s->nbuffers; b++)
        if (s->buffers[b].bucket == bucket && s->buffers[b].kind == MF_BUF_MAIN_WEIGHT)
            return b;
    return -1;
}

/* A collective reading (all_gather from) or writing (reduce_scatter into) a
 * main_weight buffer is refused on a GPU backend, with the op's index; a
 * cast from it is not; the CPU backends are unaffected. */
static void test_refuse_collective(void **state)
{
    (void)state;
    mfsdp_schedule *sh = load("hfsdp.yaml");
    mf_schedule *s = sh->s;
    int ag = find_op(s, MF_OP_ALL_GATHER, true);   /* the T1 all-gather from the cast */
    int rs = find_op(s, MF_OP_REDUCE_SCATTER, false);
    assert_true(ag > 0 && rs > 0);
    int keep = s->ops[ag].src, op = -1;
    s->ops[ag].src = main_of(s, s->ops[ag].bucket);
    assert_int_equal(mf_offload_refusing_op(s), ag);
    assert_int_equal(mfsdp_schedule_offload_op(sh), ag);
    assert_int_equal(mf_offload_decide(s, MFSDP_FLAG_OFFLOAD_MAIN, true, &op), MF_OFFLOAD_REFUSED);
    assert_int_equal(op, ag);
    assert_int_equal(mf_offload_decide(s, MFSDP_FLAG_OFFLOAD_MAIN, false, &op), MF_OFFLOAD_NOOP);
    assert_int_equal(mf_offload_decide(s, 0, true, &op), MF_OFFLOAD_OFF);
    s->ops[ag].src = keep;
    assert_int_equal(mf_offload_refusing_op(s), -1);
    keep = s->ops[rs].dst;
    s->ops[rs].dst = main_of(s, s->ops[rs].bucket);
    assert_int_equal(mf_offload_refusing_op(s), rs);
    s->ops[rs].dst = keep;

    /* mfsdp_create refuses it (the fake host allocation stands in for a GPU
     * backend's), naming the op and the buffer, on every rank. */
    s->ops[ag].src = main_of(s, s->ops[ag].bucket);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.timeout_ms = 60000;
    cfg.flags = MFSDP_FLAG_OFFLOAD_MAIN;
    mf_check_outcome outs[8];
    mf_check_opts o = {.steps = 1, .stop_rank = -1, .stop_step = -1, .out = NULL};
    int64_t live = mf_base_alloc_live();
    mf_offload_fake_host_alloc(true);
    int rc = mf_check_local(sh, NULL, &cfg, &o, outs);
    mf_offload_fake_host_alloc(false);
    assert_int_equal(rc, 2);
    char want[128];
    snprintf(want, sizeof want, "op %d (all_gather dp_outer", ag);
    int unsupported = 0;
    for (int r = 0; r < 8; r++)
        if (outs[r].create_result == MFSDP_ERR_UNSUPPORTED) {
            unsupported++;
            assert_non_null(strstr(outs[r].own, want));
            assert_non_null(strstr(outs[r].own, "is a collective on main_weight buffer 'embed/hfsdp.main_weight'"));
        }
    assert_true(unsupported >= 1);
    assert_int_equal(mf_base_alloc_live(), live);
    s->ops[ag].src = keep;
    mfsdp_schedule_free(sh);
}

/* One rank, the flag on the local backend: the same arena, views and
 * figures as without it; the runtime says it is inactive and why. */
static void test_noop_local(void **state)
{
    (void)state;
    mfsdp_schedule *sh = load("tiny_1x1.yaml");
    mfsdp_runtime *rt[2] = {NULL, NULL};
    /* The status of a live flagged runtime and its views' offsets. */
    mfsdp_local_group *g[2];
    int64_t offs[2][64][4];
    int nv = 0;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(mfsdp_local_group_create(1, &g[k]), MFSDP_OK);
        mfsdp_config cfg;
        mfsdp_config_init(&cfg);
        cfg.local_group = g[k];
        cfg.flags = k ? MFSDP_FLAG_OFFLOAD_MAIN : 0;
        assert_int_equal(mfsdp_create(sh, &cfg, &rt[k]), MFSDP_OK);
        assert_int_equal(mfsdp_allocated_bytes(rt[k]), mfsdp_schedule_peak_bytes(sh));
        assert_int_equal(mfsdp_offload_active(rt[k]), 0);
        assert_int_equal(mfsdp_offload_host_bytes(rt[k]), 0);
        nv = mfsdp_num_tensors(rt[k]);
        assert_true(nv > 0 && nv <= 64);
        const char *base = rt[k]->mem_base;
        for (int i = 0; i < nv; i++) {
            mfsdp_tensor_view v;
            assert_int_equal(mfsdp_tensor_view_get(rt[k], i, &v), MFSDP_OK);
            offs[k][i][0] = (const char *)v.weight - base;
            offs[k][i][1] = (const char *)v.grad_local - base;
            offs[k][i][2] = v.main_weight ? (const char *)v.main_weight - base : -1;
            offs[k][i][3] = v.grad ? (const char *)v.grad - base : -1;
            assert_true(offs[k][i][2] >= 0 && offs[k][i][2] < rt[k]->mem_bytes);
        }
    }
    assert_memory_equal(offs[0], offs[1], sizeof offs[0][0] * (size_t)nv);
    assert_string_equal(mfsdp_offload_status(rt[0]),
                        "offload not requested (MFSDP_FLAG_OFFLOAD_MAIN is not set)");
    assert_string_equal(mfsdp_offload_status(rt[1]),
                        "offload inactive: the local backend keeps every buffer in host memory "
                        "already (MFSDP_FLAG_OFFLOAD_MAIN is a no-op on CPU backends)");
    for (int k = 0; k < 2; k++) {
        mfsdp_destroy(rt[k]);
        mfsdp_local_group_destroy(g[k]);
    }
    assert_string_equal(mfsdp_offload_status(NULL), "no runtime");
    assert_int_equal(mfsdp_offload_active(NULL), 0);
    assert_int_equal(mfsdp_schedule_offload_op(NULL), -1);
    mfsdp_schedule_free(sh);
}

/* The oracle on thread-ranks with `flags` (fake: the active path);
 * returns rank 0's rc and fills digests[world]. */
static int oracle(const mfsdp_schedule *sh, uint32_t flags, bool fake, uint64_t *digests, char *msg)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    mf_check_outcome *outs = calloc((size_t)world, sizeof *outs);
    assert_non_null(outs);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.timeout_ms = 60000;
    cfg.flags = flags;
    mf_check_opts o = {.steps = 3, .stop_rank = -1, .stop_step = -1, .out = NULL};
    mf_offload_fake_host_alloc(fake);
    int rc = mf_check_local(sh, NULL, &cfg, &o, outs);
    mf_offload_fake_host_alloc(false);
    snprintf(msg, 1024, "%s", outs[0].msg);
    for (int64_t r = 0; r < world; r++) {
        digests[r] = outs[r].digest;
        if (rc == 0)   /* the arena stays the plan with the flag too */
            assert_int_equal(outs[r].allocated_bytes, sh->s->summary.allocated_bytes);
    }
    free(outs);
    return rc;
}

/* Without the flag, with it (a no-op) and with it active (fake host block):
 * the oracle passes and every rank's master weights agree bit for bit. */
static void test_bit_identical(void **state)
{
    (void)state;
    static const char *const names[] = {"hfsdp.yaml", "zero3.yaml", "hsdp_nosync.yaml", "ddp.yaml",
                                        "zero2_inner_zero1_outer.yaml", "mesh3d_hfsdp.yaml",
                                        "zero2_1x4.yaml", "tiny_1x1.yaml"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        mfsdp_schedule *sh = load(names[k]);
        int64_t world = mfsdp_schedule_world_size(sh);
        uint64_t d[3][64];
        char msg[1024];
        assert_true(world <= 64);
        for (int run = 0; run < 3; run++) {
            uint32_t flags = run ? MFSDP_FLAG_OFFLOAD_MAIN : 0;
            int rc = oracle(sh, flags, run == 2, d[run], msg);
            if (rc != 0)
                fail_msg("%s, run %d: %s", names[k], run, msg);
        }
        assert_memory_equal(d[0], d[1], sizeof d[0][0] * (size_t)world);
        assert_memory_equal(d[0], d[2], sizeof d[0][0] * (size_t)world);
        mfsdp_schedule_free(sh);
    }
}

/* The builder's schedules (independent of the planner; the device test's
 * matrix, tests/gpu/test_offload_device.c): every mode on 1x1, 2x2 and 2x4,
 * M in {1, 3}: none refused, the active path bit-identical to no flag. */
static void test_builder_schedules(void **state)
{
    (void)state;
    static const int meshes[] = {0, 2, 3};   /* 1x1, 2x2, 2x4 */
    for (int k = 0; k < mf_tb_nmodes; k++)
        for (size_t j = 0; j < sizeof meshes / sizeof *meshes; j++)
            for (int64_t M = 1; M <= 3; M += 2) {
                mf_tb_spec spec;
                rt_model_spec(&spec, mf_tb_modes[k], &rt_meshes[meshes[j]], M, MF_REDUCE_AVG);
                mfsdp_schedule *sh = rt_build(&spec);
                assert_int_equal(mf_offload_refusing_op(sh->s), -1);
                uint64_t d[2][64];
                char msg[1024];
                for (int run = 0; run < 2; run++)
                    if (oracle(sh, run ? MFSDP_FLAG_OFFLOAD_MAIN : 0, run == 1, d[run], msg) != 0)
                        fail_msg("%s on %s, M=%lld, run %d: %s", mf_tb_modes[k], rt_meshes[meshes[j]].name,
                                 (long long)M, run, msg);
                assert_memory_equal(d[0], d[1], sizeof d[0][0] * (size_t)mfsdp_schedule_world_size(sh));
                mfsdp_schedule_free(sh);
            }
}

/* The active path's placement on one rank: main_weight views in the host
 * block, outside the arena; gradient views in its mirror part; the figures. */
static void test_active_views(void **state)
{
    (void)state;
    mfsdp_schedule *sh = load("tiny_1x1.yaml");
    int64_t *off = calloc((size_t)sh->s->nbuffers, sizeof *off);
    int64_t mains = 0, grads = 0, total = mf_offload_layout(sh->s, off, &mains, &grads);
    free(off);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g;
    cfg.flags = MFSDP_FLAG_OFFLOAD_MAIN;
    mfsdp_runtime *rt = NULL;
    mf_offload_fake_host_alloc(true);
    assert_int_equal(mfsdp_create(sh, &cfg, &rt), MFSDP_OK);
    mf_offload_fake_host_alloc(false);
    assert_int_equal(mfsdp_offload_active(rt), 1);
    assert_int_equal(mfsdp_offload_host_bytes(rt), total);
    assert_int_equal(mfsdp_allocated_bytes(rt), mfsdp_schedule_peak_bytes(sh));
    char want[256];
    snprintf(want, sizeof want, "offload active: %lld bytes of main_weight and a %lld-byte gradient "
             "mirror in pinned host memory on the local backend", (long long)mains, (long long)grads);
    assert_string_equal(mfsdp_offload_status(rt), want);
    const char *arena = rt->mem_base, *host = NULL;
    for (int i = 0; i < mfsdp_num_tensors(rt); i++) {
        mfsdp_tensor_view v;
        assert_int_equal(mfsdp_tensor_view_get(rt, i, &v), MFSDP_OK);
        const char *mw = v.main_weight, *gr = v.grad;
        assert_true(mw < arena || mw >= arena + rt->mem_bytes);
        assert_true(gr < arena || gr >= arena + rt->mem_bytes);
        if (!host || mw < host)
            host = mw;
        assert_true(gr > mw);
    }
    for (int i = 0; i < mfsdp_num_tensors(rt); i++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, i, &v);
        assert_true((const char *)v.main_weight + 4 * v.shard_count <= host + mains);
        assert_true((const char *)v.grad >= host + mains);
        assert_true((const char *)v.grad + 4 * v.shard_count <= host + total);
    }
    mfsdp_destroy(rt);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

/* Every allocation of create failing in turn, the host block's included:
 * an error, and nothing left allocated. */
static void test_create_failures(void **state)
{
    (void)state;
    mfsdp_schedule *sh = load("tiny_1x1.yaml");
    int64_t live = mf_base_alloc_live();
    mfsdp_result r = MFSDP_ERR_OUT_OF_MEMORY;
    int k = 0;
    mf_offload_fake_host_alloc(true);
    for (; r != MFSDP_OK && k < 200; k++) {
        mfsdp_local_group *g = NULL;
        assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
        mfsdp_config cfg;
        mfsdp_config_init(&cfg);
        cfg.local_group = g;
        cfg.flags = MFSDP_FLAG_OFFLOAD_MAIN;
        mfsdp_runtime *rt = NULL;
        mf_base_alloc_fail_at(k);
        r = mfsdp_create(sh, &cfg, &rt);
        mf_base_alloc_fail_at(-1);
        if (r != MFSDP_OK) {
            assert_null(rt);
            assert_true(mfsdp_last_error(NULL)[0] != '\0');
        }
        mfsdp_destroy(rt);
        mfsdp_local_group_destroy(g);
        assert_int_equal(mf_base_alloc_live(), live);
    }
    mf_offload_fake_host_alloc(false);
    assert_int_equal(r, MFSDP_OK);
    assert_true(k > 5);
    mfsdp_schedule_free(sh);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_offload SCHEDULE_DIR\n");
        return 2;
    }
    g_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decide_examples),   cmocka_unit_test(test_layout_hfsdp),
        cmocka_unit_test(test_refuse_collective), cmocka_unit_test(test_noop_local),
        cmocka_unit_test(test_bit_identical),     cmocka_unit_test(test_builder_schedules),
        cmocka_unit_test(test_active_views),
        cmocka_unit_test(test_create_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
