/*
 * mf_ckpt_hf_rt: mfsdp_ckpt_import_hf (mfsdp_ckpt.h), and the rounds the
 * import and the export share (mf_ckpt_hf_rt.h). Every rank opens the
 * Hugging Face checkpoint (headers only: ckpt/mf_ckpt_hf.h), matches it with
 * the schedule's global model (ckpt/mf_ckpt_hf_global.h: the tensors under
 * their global names, a split tensor whole), the ranks agree that all
 * matched, then each rank reads the elements it holds, converted to the
 * main_weight dtype: a Distinct tensor's from its coordinate's global tensor
 * or, split, from its slice of the global one (one run per outer index
 * when the split dim is not the first).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_agree.h"
#include "mf_abi.h"
#include "mf_backend.h"
#include "mf_ckpt_hf.h"
#include "mf_ckpt_hf_rt.h"
#include "mf_ckpt_plan.h"
#include "mf_ckpt_stage.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

/* A round's message: the status first, then the message (mf_ckpt_hf_rt_round). */
typedef struct mf_hi_msg {
    int64_t status;
    char msg[248];
} mf_hi_msg;

mfsdp_result mf_ckpt_hf_rt_round(mf_rt *rt, const void *mine, void *all, size_t size, const char *what,
                                 const char *verdict, const char *own)
{
    int64_t status;
    mfsdp_result res = rt->be->exchange(rt, mine, size, all);
    if (res != MFSDP_OK)
        return mf_base_set_error(rt, res, "Hugging Face %s: exchange between ranks failed: %s", what,
                                 mfsdp_last_error(rt));
    memcpy(&status, mine, sizeof status);
    if (status != MFSDP_OK)
        return mf_base_set_error(rt, (mfsdp_result)status, "Hugging Face %s %s: %s", what, verdict, own);
    for (int64_t r = 0; r < rt->world; r++) {
        const char *at = (const char *)all + (size_t)r * size;
        memcpy(&status, at, sizeof status);
        if (status != MFSDP_OK)
            return mf_base_set_error(rt, (mfsdp_result)status, "Hugging Face %s %s: rank %" PRId64 ": %.*s", what,
                                     verdict, r, (int)(size - sizeof status), at + sizeof status);
    }
    return MFSDP_OK;
}

mfsdp_result mf_ckpt_hf_rt_enter(mf_rt *rt, const char *fn, mf_hf_global *g)
{
    char err[1024];
    memset(g, 0, sizeof *g);
    if (!rt)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "%s: NULL runtime", fn);
    mfsdp_result agreed = mf_base_handle_check(rt, fn);
    if (agreed == MFSDP_OK)   /* every rank is at this call (docs/runtime.md §4.4) */
        agreed = mf_agree_helper(rt, fn, 0);
    if (agreed == MFSDP_OK && mf_hf_global_build(rt->s, g, err, sizeof err) != 0)
        agreed = mf_base_set_error(rt, strncmp(err, "out of memory", 13) ? MFSDP_ERR_UNSUPPORTED
                                                                          : MFSDP_ERR_OUT_OF_MEMORY,
                                   "%s: %s", fn, err);
    return agreed;
}

mf_hf_place mf_ckpt_hf_rt_place(mf_rt *rt, const mf_hf_global *g, int view)
{
    const mf_rt_tensor *t = &rt->sh->tensors[view];
    return mf_hf_global_place(g, rt->s, t->bucket, t->index, mf_ckpt_plan_coord(rt->s, t->bucket, rt->rank));
}

mfsdp_result mf_ckpt_hf_rt_begin(mf_rt *rt, const mfsdp_hf_options *opt, int args_ok, const char *usage,
                                 mf_hf_rules *r, char *err, size_t errlen)
{
    mfsdp_result res;
    if (mf_ckpt_stage_active(rt) && (res = mf_ckpt_stage_begin(rt, err, errlen)) != MFSDP_OK)
        return res;
    if (opt && (res = MF_ABI_CHECK(mfsdp_hf_options, opt, err, errlen)) != MFSDP_OK)
        return res;
    if (!args_ok || (opt && mf_hf_rules_add(r, opt->nmaps, opt->maps, opt->nties, opt->ties) != 0))
        return snprintf(err, errlen, "%s", usage), MFSDP_ERR_INVALID_ARGUMENT;
    return MFSDP_OK;
}

static void mf_hi_fail(mf_hi_msg *m, mfsdp_result code, const char *text)
{
    m->status = code;
    snprintf(m->msg, sizeof m->msg, "%s", text);
}

/* Local elements [lo, hi) of the tensor at place p, from model tensor t
 * (the global tensor p names), converted to d, into dst. */
static int mf_hf_read_runs(const mf_hf_model *m, int t, const mf_hf_place *p, int64_t lo, int64_t hi, void *dst,
                           mf_dtype d, char *err, size_t errlen)
{
    mf_hf_run r;
    for (int64_t a = lo; a < hi; a += r.n) {
        mf_hf_global_run(p, a, hi, &r);
        if (mf_hf_model_read(m, t, r.global, r.global + r.n, (char *)dst + (size_t)(a - lo) * mf_dtype_size(d), d,
                             err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* Reads view v's held elements of model tensor t (place p) into its
 * main_weight; staged (mf_ckpt_stage.h): through a 4 MiB host buffer and
 * the stage hook. */
static int mf_hf_read_view(mf_rt *rt, const mf_hf_model *m, int t, const mf_hf_place *p,
                           const mfsdp_tensor_view *v, char *err, size_t errlen)
{
    mf_dtype d = (mf_dtype)v->main_weight_dtype;
    int64_t lo = v->shard_offset, hi = v->shard_offset + v->shard_count;
    if (!mf_ckpt_stage_active(rt))
        return mf_hf_read_runs(m, t, p, lo, hi, v->main_weight, d, err, errlen);
    size_t ds = mf_dtype_size(d), cap = (size_t)4 << 20;
    char *host = malloc(cap), msg[256] = "";
    int rc = host ? 0 : (snprintf(err, errlen, "out of memory"), -1);
    for (int64_t a = lo; a < hi && rc == 0; a += (int64_t)(cap / ds)) {
        int64_t b = hi - a < (int64_t)(cap / ds) ? hi : a + (int64_t)(cap / ds);
        rc = mf_hf_read_runs(m, t, p, a, b, host, d, err, errlen);
        if (rc == 0 && rt->be->stage(rt, (char *)v->main_weight + (size_t)(a - lo) * ds, host, (size_t)(b - a) * ds,
                                     msg, sizeof msg) != MFSDP_OK)
            rc = -1, snprintf(err, errlen, "copying host memory to buffer memory failed: %s", msg);
    }
    free(host);
    return rc;
}

mfsdp_result mfsdp_ckpt_import_hf(mfsdp_runtime *rt, const char *path, const mfsdp_hf_options *opt)
{
    mf_hf_global g;
    mfsdp_result agreed = mf_ckpt_hf_rt_enter(rt, "mfsdp_ckpt_import_hf", &g);
    if (agreed != MFSDP_OK)
        return agreed;
    mf_hi_msg mine = {0}, *all = calloc((size_t)rt->world, sizeof *all);
    int *src = calloc((size_t)g.n + 1, sizeof *src), opened = 0;
    mf_hf_model m;
    mf_hf_rules rules = {0};
    char err[8192] = "";
    mfsdp_result res;
    if (!all || !src) {
        res = mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    mfsdp_result sr = mf_ckpt_hf_rt_begin(rt, opt, path != NULL,
                                          "needs a path, and rules of the form FROM=TO / NAME=SOURCE", &rules, err,
                                          sizeof err);
    if (sr != MFSDP_OK)
        mf_hi_fail(&mine, sr, err);
    else if (mf_ckpt_hf_open(path, &m, err, sizeof err) != 0 || !(opened = 1) ||
             mf_ckpt_hf_match(&m, &rules, g.shape, g.n, src, err, sizeof err) != 0)
        mf_hi_fail(&mine, MFSDP_ERR_LOAD, err);
    if ((res = mf_ckpt_hf_rt_round(rt, &mine, all, sizeof mine, "import", "refused", err)) != MFSDP_OK)
        goto done;
    for (int k = 0; k < rt->nviews && mine.status == MFSDP_OK; k++) {
        const mfsdp_tensor_view *v = &rt->views[k];
        mf_hf_place p = mf_ckpt_hf_rt_place(rt, &g, k);
        if (v->shard_count > 0 && mf_hf_read_view(rt, &m, src[p.global], &p, v, err, sizeof err) != 0)
            mf_hi_fail(&mine, MFSDP_ERR_LOAD, err);
    }
    res = mf_ckpt_hf_rt_round(rt, &mine, all, sizeof mine, "import", "refused", err);
done:
    if (opened)
        mf_ckpt_hf_close(&m);
    mf_hf_rules_free(&rules);
    mf_hf_global_free(&g);
    free(all);
    free(src);
    return res;
}
