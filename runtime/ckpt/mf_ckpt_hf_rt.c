/*
 * mf_ckpt_hf_rt: mfsdp_ckpt_import_hf (mfsdp_ckpt.h). Every rank opens the
 * Hugging Face checkpoint (headers only), matches it with the schedule's
 * tensors, the ranks agree that all matched, then each rank reads the
 * elements it holds, converted to the main_weight dtype.
 */
#include <inttypes.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_abi.h"
#include "mf_backend.h"
#include "mf_ckpt_hf.h"
#include "mf_ckpt_hf_read.h"
#include "mf_ckpt_io.h"
#include "mf_ckpt_stage.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

typedef struct mf_hf_msg {
    int64_t status;
    char msg[248];
} mf_hf_msg;

static mfsdp_result mf_hf_round(mf_rt *rt, const mf_hf_msg *mine, mf_hf_msg *all, const char *own)
{
    mfsdp_result res = rt->be->exchange(rt, mine, sizeof *mine, all);
    if (res != MFSDP_OK)
        return mf_base_set_error(rt, res, "Hugging Face import: exchange between ranks failed: %s",
                               mfsdp_last_error(rt));
    if (mine->status != MFSDP_OK)
        return mf_base_set_error(rt, (mfsdp_result)mine->status, "Hugging Face import refused: %s", own);
    for (int64_t r = 0; r < rt->world; r++)
        if (all[r].status != MFSDP_OK)
            return mf_base_set_error(rt, (mfsdp_result)all[r].status, "Hugging Face import refused: rank %" PRId64
                                   ": %.*s", r, (int)sizeof all[r].msg, all[r].msg);
    return MFSDP_OK;
}

static void mf_hf_fail(mf_hf_msg *m, mfsdp_result code, const char *text)
{
    m->status = code;
    size_t n = strlen(text);
    n = n < sizeof m->msg - 1 ? n : sizeof m->msg - 1;
    memcpy(m->msg, text, n);
    m->msg[n] = '\0';
}

static int mf_hf_rules_from(const mfsdp_hf_options *opt, mf_hf_rules *r)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; opt && i < opt->nmaps; i++)
        if (!opt->maps || !opt->maps[i] || mf_hf_rule_add(r, 0, opt->maps[i]) != 0)
            return -1;
    for (int i = 0; opt && i < opt->nties; i++)
        if (!opt->ties || !opt->ties[i] || mf_hf_rule_add(r, 1, opt->ties[i]) != 0)
            return -1;
    return 0;
}

static void mf_hf_rules_release(mf_hf_rules *r)
{
    for (int i = 0; i < r->n; i++)
        free((char *)r->from[i]);
    for (int i = 0; i < r->ntie; i++)
        free((char *)r->tie[i]);
}


int mf_hf_read(const mf_hf_model *m, int t, int64_t start, int64_t end, void *dst, mf_dtype dst_dtype, char *err,
               size_t errlen)
{
    const mf_hf_tensor *x = &m->t[t];
    int sd = mf_hf_dtype(x->dtype);
    size_t es = mf_st_dtype_size(x->dtype), ds = mf_dtype_size(dst_dtype);
    if (sd < 0)
        return snprintf(err, errlen, "%s: tensor '%s' is %s (only F32, BF16, F16)", m->paths[x->file], x->name,
                        mf_st_dtype_name(x->dtype)), -1;
    uint8_t bounce[1 << 16];
    int64_t per = (int64_t)(sizeof bounce / es);
    for (int64_t a = start; a < end; a += per) {
        int64_t k = end - a < per ? end - a : per;
        void *to = (char *)dst + (size_t)(a - start) * ds;
        void *via = sd == (int)dst_dtype ? to : bounce;
        if (mf_ckpt_pread_all(m->fds[x->file], via, (size_t)k * es, x->offset + (uint64_t)a * es) != 0)
            return snprintf(err, errlen, "%s: read error: %s", m->paths[x->file], strerror(errno)), -1;
        if (via == bounce)
            mf_dtype_convert(to, dst_dtype, bounce, (mf_dtype)sd, k);
    }
    return 0;
}

/* Reads view v's held elements of model tensor t into its main_weight;
 * staged (mf_ckpt_stage.h): through a 4 MiB host buffer and the stage hook. */
static int mf_hf_read_view(mf_rt *rt, const mf_hf_model *m, int t, const mfsdp_tensor_view *v, char *err,
                           size_t errlen)
{
    mf_dtype d = (mf_dtype)v->main_weight_dtype;
    int64_t lo = v->shard_offset, hi = v->shard_offset + v->shard_count;
    if (!mf_ckpt_staged(rt))
        return mf_hf_read(m, t, lo, hi, v->main_weight, d, err, errlen);
    size_t ds = mf_dtype_size(d), cap = (size_t)4 << 20;
    char *host = malloc(cap), msg[256] = "";
    int rc = host ? 0 : (snprintf(err, errlen, "out of memory"), -1);
    for (int64_t a = lo; a < hi && rc == 0; a += (int64_t)(cap / ds)) {
        int64_t b = hi - a < (int64_t)(cap / ds) ? hi : a + (int64_t)(cap / ds);
        rc = mf_hf_read(m, t, a, b, host, d, err, errlen);
        if (rc == 0 && rt->be->stage(rt, (char *)v->main_weight + (size_t)(a - lo) * ds, host, (size_t)(b - a) * ds,
                                     msg, sizeof msg) != MFSDP_OK)
            rc = -1, snprintf(err, errlen, "copying host memory to buffer memory failed: %s", msg);
    }
    free(host);
    return rc;
}

/* Matches the runtime's tensors with the model: src[k] per view k. */
static int mf_hf_rt_match(mf_rt *rt, const mf_hf_model *m, const mf_hf_rules *rules, int *src, char *err,
                          size_t errlen)
{
    int n = rt->nviews, rc = -1;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    int *nd = calloc((size_t)n + 1, sizeof *nd);
    int64_t(*dims)[MF_MAX_DIMS] = calloc((size_t)n + 1, sizeof *dims);
    if (names && nd && dims) {
        for (int k = 0; k < n; k++) {
            names[k] = rt->views[k].name;
            nd[k] = rt->views[k].ndims;
            memcpy(dims[k], rt->views[k].dims, sizeof dims[k]);
        }
        rc = mf_hf_match(m, rules, n, names, nd, (const int64_t(*)[MF_MAX_DIMS])dims, src, err, errlen);
    } else {
        snprintf(err, errlen, "out of memory");
    }
    free(names);
    free(nd);
    free(dims);
    return rc;
}

mfsdp_result mfsdp_ckpt_import_hf(mfsdp_runtime *rt, const char *path, const mfsdp_hf_options *opt)
{
    if (!rt)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_ckpt_import_hf: NULL runtime");
    mf_hf_msg mine = {0}, *all = calloc((size_t)rt->world, sizeof *all);
    int *src = calloc((size_t)rt->nviews + 1, sizeof *src), opened = 0;
    mf_hf_model m;
    mf_hf_rules rules;
    char err[8192] = "";
    mfsdp_result res;
    int bad_abi = opt && MF_ABI_CHECK(mfsdp_hf_options, opt, err, sizeof err) != MFSDP_OK;
    int bad_rules = mf_hf_rules_from(bad_abi ? NULL : opt, &rules);
    if (!all || !src) {
        res = mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    mfsdp_result sr = MFSDP_OK;
    if (mf_ckpt_staged(rt) && (sr = mf_ckpt_stage_begin(rt, err, sizeof err)) != MFSDP_OK)
        mf_hf_fail(&mine, sr, err);
    else if (bad_abi)
        mf_hf_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
    else if (!path || bad_rules)
        snprintf(err, sizeof err, "needs a path, and rules of the form FROM=TO / NAME=SOURCE"),
            mf_hf_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
    else if (mf_hf_open(path, &m, err, sizeof err) != 0 || !(opened = 1) ||
             mf_hf_rt_match(rt, &m, &rules, src, err, sizeof err) != 0)
        mf_hf_fail(&mine, MFSDP_ERR_LOAD, err);
    if ((res = mf_hf_round(rt, &mine, all, err)) != MFSDP_OK)
        goto done;
    for (int k = 0; k < rt->nviews && mine.status == MFSDP_OK; k++) {
        const mfsdp_tensor_view *v = &rt->views[k];
        if (v->shard_count > 0 && mf_hf_read_view(rt, &m, src[k], v, err, sizeof err) != 0)
            mf_hf_fail(&mine, MFSDP_ERR_LOAD, err);
    }
    res = mf_hf_round(rt, &mine, all, err);
done:
    if (opened)
        mf_hf_close(&m);
    mf_hf_rules_release(&rules);
    free(all);
    free(src);
    return res;
}
