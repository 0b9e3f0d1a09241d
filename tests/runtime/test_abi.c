/*
 * The configuration structs' size and version (issue 27, "the ABI as data";
 * docs/runtime.md, "Configuration structs"): each initializer macro gives what
 * its init function gives, both set size and version, and mfsdp_create,
 * mfsdp_ckpt_save, mfsdp_ckpt_load and the Hugging Face import and export
 * refuse a struct that was never initialized (zeroed), one from a newer header
 * (bigger, or a higher version) and one of a size the library does not know,
 * with MFSDP_ERR_INVALID_ARGUMENT and a message naming the struct and its
 * initializers -- before reading any other field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mfsdp_ckpt.h"
#include "rt_testlib.h"
#ifdef MFSDP_HAVE_CUDA
#include "mfsdp_nccl.h"
#endif

static const rt_mesh mesh_1x1 = {"1x1", 2, {1, 1}};

/* r is MFSDP_ERR_INVALID_ARGUMENT and msg holds every one of the needles. */
static void refused_with(mfsdp_result r, const char *msg, const char *const *needles)
{
    if (r != MFSDP_ERR_INVALID_ARGUMENT)
        fail_msg("result %d (%s), expected MFSDP_ERR_INVALID_ARGUMENT; message: %s", (int)r,
                 mfsdp_result_string(r), msg);
    for (const char *const *n = needles; *n; n++)
        if (!strstr(msg, *n))
            fail_msg("message lacks \"%s\": %s", *n, msg);
}

/* The four headers a caller's struct may carry that the library refuses,
 * and what the message must say for each. */
typedef struct bad_header {
    size_t size_delta; /* added to sizeof; (size_t)-sizeof for 0 */
    int zero_size;
    uint32_t version;
    const char *says;
} bad_header;

static const bad_header bad_headers[] = {
    {0, 1, 0, "was never initialized (size 0, version 0)"},
    {8, 0, MFSDP_ABI_VERSION, "is from a newer header"},
    {0, 0, MFSDP_ABI_VERSION + 1, "is from a newer header"},
    {(size_t)-8, 0, MFSDP_ABI_VERSION, "has an unknown size"},
};
#define NBAD (sizeof bad_headers / sizeof bad_headers[0])

/* The HFSDP model on a mesh of one rank. */
static mfsdp_schedule *one_rank_schedule(void)
{
    mf_tb_spec spec;
    rt_model_spec(&spec, "hfsdp", &mesh_1x1, 1, MF_REDUCE_AVG);
    return rt_build(&spec);
}

#define SET_HEADER(p, b)                                                       \
    do {                                                                       \
        (p)->size = (b)->zero_size ? 0 : sizeof *(p) + (b)->size_delta;         \
        (p)->version = (b)->version;                                           \
    } while (0)

/* The header and the defaults each initializer must give. */
#define HEADER_IS_THIS_LIBRARYS(p)                       \
    do {                                                 \
        assert_int_equal((p)->size, sizeof *(p));        \
        assert_int_equal((p)->version, MFSDP_ABI_VERSION); \
    } while (0)

static void config_defaults(const mfsdp_config *c)
{
    HEADER_IS_THIS_LIBRARYS(c);
    assert_int_equal(c->backend, MFSDP_BACKEND_LOCAL);
    assert_int_equal(c->rank, -1);
    assert_int_equal(c->timeout_ms, 600000);
    assert_int_equal(c->flags, 0);
    assert_null(c->local_group);
    assert_null(c->mpi_comm);
    assert_null(c->backend_config);
}

static void save_defaults(const mfsdp_ckpt_save_options *o)
{
    HEADER_IS_THIS_LIBRARYS(o);
    assert_int_equal(o->step, 0);
    assert_int_equal(o->nstates, 0);
    assert_null(o->states);
    assert_null(o->user_blob);
    assert_int_equal(o->user_blob_bytes, 0);
}

static void load_defaults(const mfsdp_ckpt_load_options *o)
{
    HEADER_IS_THIS_LIBRARYS(o);
    assert_int_equal(o->flags, 0);
    assert_int_equal(o->nstates, 0);
    assert_null(o->states);
    assert_int_equal(o->user_blob_rank, -1);
    assert_null(o->user_blob);
    assert_int_equal(o->user_blob_capacity, 0);
    assert_int_equal(o->user_blob_bytes, 0);
    assert_int_equal(o->step, 0);
    assert_int_equal(o->bytes_read, 0);
}

static void hf_defaults(const mfsdp_hf_options *o)
{
    HEADER_IS_THIS_LIBRARYS(o);
    assert_int_equal(o->nmaps, 0);
    assert_null(o->maps);
    assert_int_equal(o->nties, 0);
    assert_null(o->ties);
}

/* The macro's struct and the init function's (over garbage) both pass `check`. */
#define BOTH_INITIALIZERS(type, macro, init, check) \
    do {                                            \
        type by_macro = macro, by_init;             \
        memset(&by_init, 0x5a, sizeof by_init);     \
        init(&by_init);                             \
        check(&by_macro);                           \
        check(&by_init);                            \
    } while (0)

static void test_macros_equal_init_functions(void **state)
{
    (void)state;
    BOTH_INITIALIZERS(mfsdp_config, MFSDP_CONFIG_INIT, mfsdp_config_init, config_defaults);
    BOTH_INITIALIZERS(mfsdp_ckpt_save_options, MFSDP_CKPT_SAVE_OPTIONS_INIT, mfsdp_ckpt_save_options_init,
                      save_defaults);
    BOTH_INITIALIZERS(mfsdp_ckpt_load_options, MFSDP_CKPT_LOAD_OPTIONS_INIT, mfsdp_ckpt_load_options_init,
                      load_defaults);
    BOTH_INITIALIZERS(mfsdp_hf_options, MFSDP_HF_OPTIONS_INIT, mfsdp_hf_options_init, hf_defaults);
}

static void test_create_refuses_unknown_config(void **state)
{
    (void)state;
    mfsdp_schedule *sh = one_rank_schedule();
    for (size_t k = 0; k < NBAD; k++) {
        mfsdp_config cfg = MFSDP_CONFIG_INIT;
        SET_HEADER(&cfg, &bad_headers[k]);
        static char not_null;
        mfsdp_runtime *rt = (mfsdp_runtime *)(void *)&not_null; /* create must clear it */
        const char *says[] = {"mfsdp_create: mfsdp_config ", bad_headers[k].says,
                              "MFSDP_CONFIG_INIT or mfsdp_config_init()", NULL};
        refused_with(mfsdp_create(sh, &cfg, &rt), mfsdp_last_error(NULL), says);
        assert_null(rt);
    }
    /* The same config initialized is accepted (a world of one needs no group). */
    mfsdp_config cfg = MFSDP_CONFIG_INIT;
    mfsdp_runtime *rt = NULL;
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
    cfg.local_group = g;
    assert_int_equal(mfsdp_create(sh, &cfg, &rt), MFSDP_OK);
    mfsdp_destroy(rt);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

#ifdef MFSDP_HAVE_CUDA
/* The NCCL config a GPU backend reads from backend_config: checked in
 * mfsdp_create before the backend opens (no GPU needed to be refused). */
static void nccl_defaults(const mfsdp_nccl_config *c)
{
    HEADER_IS_THIS_LIBRARYS(c);
    assert_null(c->world_comm);
    for (size_t i = 0; i < sizeof c->unique_id.internal; i++)
        assert_int_equal(c->unique_id.internal[i], 0);
    assert_int_equal(c->has_unique_id, 0);
    assert_int_equal(c->device, -1);
    assert_null(c->compute_stream);
    assert_int_equal(c->flags, MFSDP_NCCL_MEM_ALLOC);
    assert_int_equal(c->watchdog_poll_ms, 100);
}

static void test_create_refuses_unknown_nccl_config(void **state)
{
    (void)state;
    BOTH_INITIALIZERS(mfsdp_nccl_config, MFSDP_NCCL_CONFIG_INIT, mfsdp_nccl_config_init, nccl_defaults);

    mfsdp_schedule *sh = one_rank_schedule();
    for (size_t k = 0; k < NBAD; k++) {
        mfsdp_nccl_config nc = MFSDP_NCCL_CONFIG_INIT;
        SET_HEADER(&nc, &bad_headers[k]);
        mfsdp_config cfg = MFSDP_CONFIG_INIT;
        mfsdp_config_set_nccl(&cfg, &nc);
        mfsdp_runtime *rt = NULL;
        const char *says[] = {"mfsdp_create: mfsdp_nccl_config ", bad_headers[k].says,
                              "MFSDP_NCCL_CONFIG_INIT or mfsdp_nccl_config_init()", NULL};
        refused_with(mfsdp_create(sh, &cfg, &rt), mfsdp_last_error(NULL), says);
        assert_null(rt);
        mfsdp_config_set_cuda_local(&cfg, NULL, &nc);
        refused_with(mfsdp_create(sh, &cfg, &rt), mfsdp_last_error(NULL), says);
        assert_null(rt);
    }
    mfsdp_schedule_free(sh);
}
#endif

/* One runtime on a world of one for the checkpoint calls. */
typedef struct one_rank {
    mfsdp_schedule *sh;
    mfsdp_local_group *g;
    mfsdp_runtime *rt;
} one_rank;

static void one_rank_open(one_rank *o)
{
    o->sh = one_rank_schedule();
    assert_int_equal(mfsdp_local_group_create(1, &o->g), MFSDP_OK);
    mfsdp_config cfg = MFSDP_CONFIG_INIT;
    cfg.local_group = o->g;
    cfg.timeout_ms = 10000;
    assert_int_equal(mfsdp_create(o->sh, &cfg, &o->rt), MFSDP_OK);
}

static void one_rank_close(one_rank *o)
{
    mfsdp_destroy(o->rt);
    mfsdp_local_group_destroy(o->g);
    mfsdp_schedule_free(o->sh);
}

static void test_checkpoints_refuse_unknown_options(void **state)
{
    (void)state;
    one_rank o;
    one_rank_open(&o);
    char dir[] = "/tmp/mfsdp_test_abi_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char ckpt[64], hf[64];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    snprintf(hf, sizeof hf, "%s/hf", dir);
    for (size_t k = 0; k < NBAD; k++) {
        const bad_header *b = &bad_headers[k];
        mfsdp_ckpt_save_options so = MFSDP_CKPT_SAVE_OPTIONS_INIT;
        SET_HEADER(&so, b);
        const char *save[] = {"mfsdp_ckpt_save_options ", b->says,
                              "MFSDP_CKPT_SAVE_OPTIONS_INIT or mfsdp_ckpt_save_options_init()", NULL};
        refused_with(mfsdp_ckpt_save(o.rt, ckpt, &so), mfsdp_last_error(o.rt), save);

        mfsdp_ckpt_load_options lo = MFSDP_CKPT_LOAD_OPTIONS_INIT;
        SET_HEADER(&lo, b);
        const char *load[] = {"mfsdp_ckpt_load_options ", b->says,
                              "MFSDP_CKPT_LOAD_OPTIONS_INIT or mfsdp_ckpt_load_options_init()", NULL};
        refused_with(mfsdp_ckpt_load(o.rt, ckpt, &lo), mfsdp_last_error(o.rt), load);

        mfsdp_hf_options ho = MFSDP_HF_OPTIONS_INIT;
        SET_HEADER(&ho, b);
        const char *hfo[] = {"mfsdp_hf_options ", b->says, "MFSDP_HF_OPTIONS_INIT or mfsdp_hf_options_init()",
                             NULL};
        refused_with(mfsdp_ckpt_export_hf(o.rt, hf, MFSDP_FP32, &ho, 0), mfsdp_last_error(o.rt), hfo);
        refused_with(mfsdp_ckpt_import_hf(o.rt, hf, &ho), mfsdp_last_error(o.rt), hfo);
    }
    /* Nothing was written by the refused calls; initialized, they work. */
    char probe[80];
    snprintf(probe, sizeof probe, "%s/ckpt/manifest.json", dir);
    assert_null(fopen(probe, "r"));
    mfsdp_ckpt_save_options so = MFSDP_CKPT_SAVE_OPTIONS_INIT;
    so.step = 3;
    assert_int_equal(mfsdp_ckpt_save(o.rt, ckpt, &so), MFSDP_OK);
    mfsdp_ckpt_load_options lo = MFSDP_CKPT_LOAD_OPTIONS_INIT;
    assert_int_equal(mfsdp_ckpt_load(o.rt, ckpt, &lo), MFSDP_OK);
    assert_int_equal(lo.step, 3);
    mfsdp_hf_options ho = MFSDP_HF_OPTIONS_INIT;
    assert_int_equal(mfsdp_ckpt_export_hf(o.rt, hf, MFSDP_FP32, &ho, 0), MFSDP_OK);
    assert_int_equal(mfsdp_ckpt_import_hf(o.rt, hf, &ho), MFSDP_OK);
    one_rank_close(&o);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_macros_equal_init_functions),
        cmocka_unit_test(test_create_refuses_unknown_config),
        cmocka_unit_test(test_checkpoints_refuse_unknown_options),
#ifdef MFSDP_HAVE_CUDA
        cmocka_unit_test(test_create_refuses_unknown_nccl_config),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
