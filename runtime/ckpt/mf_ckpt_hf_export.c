/*
 * mf_ckpt_hf_export: mfsdp_ckpt_export_hf (mfsdp_ckpt.h). The export writes
 * the global model (ckpt/mf_ckpt_hf_global.h): every tensor under its name,
 * a Distinct one under its global names (rename: each coordinate's tensor
 * once; split: one tensor, each coordinate writing its slice, strided when
 * the split dim is not the first; never gathered). Its layout (files,
 * headers, every tensor's byte offset: ckpt/mf_ckpt_hf_layout.h) is a
 * function of the schedule and the options, computed identically on every
 * rank; rank 0 creates the files with their headers at full size, then
 * every rank writes its share of the main_weight elements it holds
 * (converted): the ranks holding the same range of a tensor at the same
 * coordinate (its replicas, mf_ckpt_plan_replicas) cut it into as many
 * parts, each written by one of them, so every byte is written once. Then
 * every rank fsyncs and rank 0 commits the directory. Three rounds of the
 * backend's all-gather.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_backend.h"
#include "mf_ckpt_build.h"
#include "mf_ckpt_hf_global.h"
#include "mf_ckpt_hf_layout.h"
#include "mf_ckpt_hf_rt.h"
#include "mf_ckpt_plan.h"
#include "mf_ckpt_stage.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

/* A round's message: the status first, then the message (mf_ckpt_hf_rt_round). */
typedef struct mf_hx_msg {
    int64_t status;
    char msg[208];
    char id[40];            /* rank 0's: the temporary directory's */
} mf_hx_msg;

/* Local elements [a, e) of view v (place p) into the files, a chunk at a
 * time (staged, host non-NULL: the chunk through the stage hook once), each
 * chunk run by run (one run for D = 0, one per local row for a split along
 * D > 0). */
static int mf_hx_put(mf_rt *rt, mf_hf_writer *w, const mfsdp_tensor_view *v, const mf_hf_place *p, int64_t a,
                     int64_t e, uint8_t *host, char *err, size_t errlen)
{
    mf_dtype sd = (mf_dtype)v->main_weight_dtype;
    size_t ss = mf_dtype_size(sd), ds = mf_dtype_size(w->l->dtype);
    int64_t per = (int64_t)(MF_HF_WRITE_CHUNK / (ds > ss ? ds : ss));
    char msg[256] = "";
    for (int64_t x = a; x < e; x += per) {
        int64_t end = e - x < per ? e : x + per;
        const char *from = (const char *)v->main_weight + (size_t)(x - v->shard_offset) * ss;
        if (host) {
            if (rt->be->stage(rt, host, from, (size_t)(end - x) * ss, msg, sizeof msg) != MFSDP_OK)
                return snprintf(err, errlen, "copying buffer memory to host memory failed: %s", msg), -1;
            from = (const char *)host;
        }
        mf_hf_run r;
        for (int64_t y = x; y < end; y += r.n) {
            mf_hf_global_run(p, y, end, &r);
            if (mf_hf_writer_put(w, p->global, r.global, from + (size_t)(y - x) * ss, sd, r.n, err, errlen) != 0)
                return -1;
        }
    }
    return 0;
}

/* This rank's share of view k's held elements [*a, *e): part (j + k) mod n
 * of n equal parts, j its position among the n replicas of its bucket
 * (reps[], ranks ascending, refreshed when the bucket changes). */
static void mf_hx_share(mf_rt *rt, int k, int64_t *reps, int *bucket, int64_t *n, int64_t *a, int64_t *e)
{
    const mfsdp_tensor_view *v = &rt->views[k];
    int b = rt->sh->tensors[k].bucket;
    if (*bucket != b) {
        *n = mf_ckpt_plan_replicas(rt->s, b, rt->rank, reps);
        *bucket = b;
    }
    int64_t j = 0;
    while (j < *n && reps[j] != rt->rank)
        j++;
    int64_t q = (j + k) % *n, len = v->shard_count;
    *a = v->shard_offset + len * q / *n;
    *e = v->shard_offset + len * (q + 1) / *n;
}

/* This rank's share of every tensor it holds, converted, into the files;
 * staged (mf_ckpt_stage.h): buffer memory only through the stage hook, 1 MiB
 * at a time. */
static int mf_hx_write(mf_rt *rt, const mf_hf_global *g, const mf_hf_layout *l, const char *tmp, char *err,
                       size_t errlen)
{
    int staged = mf_ckpt_stage_active(rt), rc = -1, bucket = -1;
    uint8_t *host = staged ? malloc(MF_HF_WRITE_CHUNK) : NULL;
    int64_t *reps = malloc((size_t)rt->world * sizeof *reps), n = 1, a, e;
    mf_hf_writer w;
    if ((staged && !host) || !reps || mf_hf_writer_open(&w, l, tmp, err, errlen) != 0) {
        free(host);
        free(reps);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    for (int k = 0; k < rt->nviews; k++) {
        mf_hf_place p = mf_ckpt_hf_rt_place(rt, g, k);
        if (rt->views[k].shard_count == 0 || l->file[p.global] < 0)
            continue; /* nothing held; or tied: stored once, as its source */
        mf_hx_share(rt, k, reps, &bucket, &n, &a, &e);
        if (a < e && mf_hx_put(rt, &w, &rt->views[k], &p, a, e, host, err, errlen) != 0)
            goto done;
    }
    rc = 0;
done:
    if (mf_hf_writer_close(&w, rc == 0, err, errlen) != 0)
        rc = -1;
    free(host);
    free(reps);
    return rc;
}

static void mf_hx_fail(mf_hx_msg *m, mfsdp_result code, const char *text)
{
    m->status = code;
    snprintf(m->msg, sizeof m->msg, "%.200s", text);
}

mfsdp_result mfsdp_ckpt_export_hf(mfsdp_runtime *rt, const char *dir_arg, mfsdp_dtype dtype,
                                  const mfsdp_hf_options *opt, uint64_t max_file_bytes)
{
    char dir[4001] = ""; /* without trailing slashes: DIR.tmp-ID is made next to it */
    if (dir_arg)
        snprintf(dir, sizeof dir, "%.*s", (int)mf_ckpt_io_dir_len(dir_arg), dir_arg);
    mf_hf_global g;
    mfsdp_result agreed = mf_ckpt_hf_rt_enter(rt, "mfsdp_ckpt_export_hf", &g);
    if (agreed != MFSDP_OK)
        return agreed;
    mf_hx_msg mine = {0}, *all = calloc((size_t)rt->world, sizeof *all);
    mf_hf_layout l = {0};
    mf_hf_rules rules = {0};
    char err[4096] = "", tmp[4200] = "";
    int have_layout = 0;
    mfsdp_result res = MFSDP_ERR_OUT_OF_MEMORY;
    if (!all) {
        res = mf_base_set_error(rt, res, "out of memory");
        goto done;
    }
    mfsdp_result sr = mf_ckpt_hf_rt_begin(rt, opt, dir_arg && mfsdp_dtype_size(dtype) != 0,
                                          "needs a directory, a dtype and rules FROM=TO / NAME=SOURCE", &rules, err,
                                          sizeof err);
    if (sr != MFSDP_OK)
        mf_hx_fail(&mine, sr, err);
    else if (mf_hf_layout_build(g.shape, g.n, &rules, (mf_dtype)dtype,
                                max_file_bytes ? max_file_bytes : MF_HF_MAX_FILE_BYTES, &l) != 0 || !(have_layout = 1))
        snprintf(err, sizeof err, "out of memory (layout)"), mf_hx_fail(&mine, MFSDP_ERR_OUT_OF_MEMORY, err);
    for (int i = 0; mine.status == MFSDP_OK && i < rules.ntie; i++) {
        int s = mf_hf_global_find(&g, rules.tie_src[i]), t = mf_hf_global_find(&g, rules.tie[i]);
        if (s < 0 || t < 0 || g.shape[s].numel != g.shape[t].numel || mf_hf_rules_tied(&rules, rules.tie_src[i]))
            snprintf(err, sizeof err, "tie %s=%s: not two tensors of one size", rules.tie[i], rules.tie_src[i]),
                mf_hx_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
    }
    if (mine.status == MFSDP_OK && rt->rank == 0) {
        struct stat st;
        mf_ckpt_build_new_id(mine.id);
        snprintf(tmp, sizeof tmp, "%.4000s.tmp-%s", dir, mine.id);
        if (stat(dir, &st) == 0)
            snprintf(err, sizeof err, "%.4000s already exists", dir), mf_hx_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
        else if (mkdir(tmp, 0755) != 0 || mf_hf_layout_create(&l, tmp, err, sizeof err) != 0)
            mf_hx_fail(&mine, MFSDP_ERR_BACKEND, err[0] ? err : "cannot create the temporary directory");
    }
    res = mf_ckpt_hf_rt_round(rt, &mine, all, sizeof mine, "export", "failed", err);
    if (res == MFSDP_OK) {
        snprintf(tmp, sizeof tmp, "%.4000s.tmp-%.32s", dir, all[0].id);
        memset(&mine, 0, sizeof mine);
        if (mf_hx_write(rt, &g, &l, tmp, err, sizeof err) != 0)
            mf_hx_fail(&mine, MFSDP_ERR_BACKEND, err);
        res = mf_ckpt_hf_rt_round(rt, &mine, all, sizeof mine, "export", "failed", err);
        memset(&mine, 0, sizeof mine);
        if (rt->rank == 0 && res == MFSDP_OK && mf_ckpt_write_commit_dir(tmp, dir, err, sizeof err) != 0)
            mf_hx_fail(&mine, MFSDP_ERR_BACKEND, err);
        if (res == MFSDP_OK)
            res = mf_ckpt_hf_rt_round(rt, &mine, all, sizeof mine, "export", "failed", err);
    }
    if (rt->rank == 0 && res != MFSDP_OK && tmp[0]) /* (absent after a commit: harmless) */
        mf_ckpt_io_remove_dir(tmp);
done:
    if (have_layout)
        mf_hf_layout_free(&l);
    mf_hf_global_free(&g);
    mf_hf_rules_free(&rules);
    free(all);
    return res;
}
