/*
 * mf_ckpt_hf_export: mfsdp_ckpt_export_hf (mfsdp_ckpt.h). The export's
 * layout (files, headers, every tensor's byte offset: ckpt/mf_ckpt_hf_layout.h) is
 * a function of the schedule and the options, computed identically on every
 * rank; rank 0 creates the files with their headers at full size, then every
 * rank writes the main_weight pieces the save plan gives it (converted),
 * fsyncs, and rank 0 commits the directory. Three rounds of the backend's
 * all-gather.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_backend.h"
#include "mf_ckpt_build.h"
#include "mf_ckpt_hf_layout.h"
#include "mf_ckpt_hf_rt.h"
#include "mf_ckpt_stage.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

/* A round's message: the status first, then the message (mf_ckpt_hf_rt_round). */
typedef struct mf_hx_msg {
    int64_t status;
    char msg[208];
    char id[40];            /* rank 0's: the temporary directory's */
} mf_hx_msg;

/* This rank's pieces of the save plan, converted, into the files; staged
 * (mf_ckpt_stage.h): buffer memory only through the stage hook, 1 MiB at a
 * time. */
static int mf_hx_write(mf_rt *rt, const mf_ckpt_plan *p, const mf_hf_layout *l, const char *tmp, char *err,
                       size_t errlen)
{
    int staged = mf_ckpt_stage_active(rt), rc = -1;
    uint8_t *host = staged ? malloc(MF_HF_WRITE_CHUNK) : NULL;
    char msg[256] = "";
    size_t ds = mf_dtype_size(l->dtype);
    mf_hf_writer w;
    if ((staged && !host) || mf_hf_writer_open(&w, l, tmp, err, errlen) != 0) {
        free(host);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    for (int64_t i = p->first[rt->rank]; i < p->first[rt->rank + 1]; i++) {
        const mf_ckpt_piece *pc = &p->p[i];
        if (l->file[pc->tensor] < 0)
            continue; /* tied: stored once, as its source */
        const mfsdp_tensor_view *v = &rt->views[mfsdp_tensor_find(rt, p->t[pc->tensor].name)];
        mf_dtype sd = (mf_dtype)v->main_weight_dtype;
        size_t ss = mf_dtype_size(sd);
        int64_t per = (int64_t)(MF_HF_WRITE_CHUNK / (ds > ss ? ds : ss));
        for (int64_t a = pc->start; a < pc->end; a += per) {
            int64_t n = pc->end - a < per ? pc->end - a : per;
            const char *from = (const char *)v->main_weight + (size_t)(a - v->shard_offset) * ss;
            if (staged) {
                if (rt->be->stage(rt, host, from, (size_t)n * ss, msg, sizeof msg) != MFSDP_OK) {
                    snprintf(err, errlen, "copying buffer memory to host memory failed: %s", msg);
                    goto done;
                }
                from = (const char *)host;
            }
            if (mf_hf_writer_put(&w, pc->tensor, a, from, sd, n, err, errlen) != 0)
                goto done;
        }
    }
    rc = 0;
done:
    if (mf_hf_writer_close(&w, rc == 0, err, errlen) != 0)
        rc = -1;
    free(host);
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
    mfsdp_result agreed = mf_ckpt_hf_rt_enter(rt, "mfsdp_ckpt_export_hf");
    if (agreed != MFSDP_OK)
        return agreed;
    mf_hx_msg mine = {0}, *all = calloc((size_t)rt->world, sizeof *all);
    mf_ckpt_plan p = {0};
    mf_hf_layout l = {0};
    mf_hf_shape *shapes = NULL;
    mf_hf_rules rules = {0};
    char err[4096] = "", tmp[4200] = "";
    int have_plan = 0, have_layout = 0;
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
    else if (mf_ckpt_plan_build(rt->s, &p, err, sizeof err) != 0 || !(have_plan = 1) ||
             !(shapes = mf_ckpt_hf_shapes_of_plan(&p)) ||
             mf_hf_layout_build(shapes, p.ntensors, &rules, (mf_dtype)dtype,
                                max_file_bytes ? max_file_bytes : MF_HF_MAX_FILE_BYTES, &l) != 0 || !(have_layout = 1))
        snprintf(err, sizeof err, "out of memory (layout)"), mf_hx_fail(&mine, MFSDP_ERR_OUT_OF_MEMORY, err);
    for (int i = 0; mine.status == MFSDP_OK && i < rules.ntie; i++) {
        int s = mf_ckpt_plan_find(&p, rules.tie_src[i]), t = mf_ckpt_plan_find(&p, rules.tie[i]);
        if (s < 0 || t < 0 || p.t[s].numel != p.t[t].numel || mf_hf_rules_tied(&rules, rules.tie_src[i]))
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
        if (mf_hx_write(rt, &p, &l, tmp, err, sizeof err) != 0)
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
    if (have_plan)
        mf_ckpt_plan_free(&p);
    mf_hf_rules_free(&rules);
    free(shapes);
    free(all);
    return res;
}
