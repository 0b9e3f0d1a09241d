/*
 * mf_ckpt_hf_export: mfsdp_ckpt_export_hf (mfsdp_ckpt.h). The export's
 * layout (files, headers, every tensor's byte offset) is a function of the
 * schedule and the options, computed identically on every rank; rank 0
 * creates the files with their headers at full size, then every rank writes
 * the main_weight pieces the save plan gives it (converted), fsyncs, and
 * rank 0 commits the directory. Three rounds of the backend's all-gather.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mf_abi.h"
#include "mf_backend.h"
#include "mf_ckpt_build.h"
#include "mf_ckpt_hf.h"
#include "mf_ckpt_stage.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

typedef struct mf_hx_msg {
    int64_t status;
    char id[40];
    char msg[208];
} mf_hx_msg;

/* The layout: per plan tensor its file (-1: tied, not stored) and offset. */
typedef struct mf_hx_layout {
    int nfiles;
    int *file;
    uint64_t *offset;
    uint8_t **header;       /* per file: 8-byte length + JSON */
    size_t *header_len;
    uint64_t *bytes;        /* per file */
    char **hf_name;         /* per plan tensor */
} mf_hx_layout;

static void mf_hx_free(mf_hx_layout *l, int nt)
{
    for (int f = 0; l->header && f < l->nfiles; f++)
        free(l->header[f]);
    for (int k = 0; l->hf_name && k < nt; k++)
        free(l->hf_name[k]);
    free(l->file);
    free(l->offset);
    free(l->header);
    free(l->header_len);
    free(l->bytes);
    free(l->hf_name);
}

static int mf_hx_tied(const mf_hf_rules *r, const char *name)
{
    for (int i = 0; i < r->ntie; i++)
        if (strcmp(r->tie[i], name) == 0)
            return 1;
    return 0;
}

static int mf_hx_layout_build(const mf_ckpt_plan *p, const mf_hf_rules *r, mf_dtype dt, uint64_t maxb,
                              mf_hx_layout *l)
{
    int nt = p->ntensors;
    char name[1024];
    memset(l, 0, sizeof *l);
    l->file = calloc((size_t)nt + 1, sizeof *l->file);
    l->offset = calloc((size_t)nt + 1, sizeof *l->offset);
    l->hf_name = calloc((size_t)nt + 1, sizeof *l->hf_name);
    mf_st_entry *e = calloc((size_t)nt + 1, sizeof *e);
    if (!l->file || !l->offset || !l->hf_name || !e)
        goto oom;
    uint64_t in_file = 0;
    for (int k = 0; k < nt; k++) {
        uint64_t b = (uint64_t)p->t[k].numel * mf_dtype_size(dt);
        if (mf_hx_tied(r, p->t[k].name)) {
            l->file[k] = -1;
            continue;
        }
        if (in_file > 0 && in_file + b > maxb) {
            l->nfiles++;
            in_file = 0;
        }
        mf_hf_to_hf(r, p->t[k].name, name, sizeof name);
        if (!(l->hf_name[k] = strdup(name)))
            goto oom;
        l->file[k] = l->nfiles;
        l->offset[k] = in_file; /* data-relative for now */
        in_file += b;
    }
    l->nfiles++;
    l->header = calloc((size_t)l->nfiles, sizeof *l->header);
    l->header_len = calloc((size_t)l->nfiles, sizeof *l->header_len);
    l->bytes = calloc((size_t)l->nfiles, sizeof *l->bytes);
    if (!l->header || !l->header_len || !l->bytes)
        goto oom;
    const char *keys[] = {"format"}, *vals[] = {"pt"};
    for (int f = 0; f < l->nfiles; f++) {
        int n = 0;
        uint64_t data = 0;
        for (int k = 0; k < nt; k++)
            if (l->file[k] == f) {
                e[n] = (mf_st_entry){.name = l->hf_name[k], .dtype = mf_ckpt_st_dtype(dt), .ndims = p->t[k].ndims,
                                     .begin = l->offset[k]};
                memcpy(e[n].shape, p->t[k].dims, sizeof e[n].shape);
                e[n].end = e[n].begin + (uint64_t)p->t[k].numel * mf_dtype_size(dt);
                data = e[n].end;
                n++;
            }
        if (mf_st_build(e, n, keys, vals, 1, &l->header[f], &l->header_len[f]) != 0)
            goto oom;
        l->bytes[f] = l->header_len[f] + data;
    }
    for (int k = 0; k < nt; k++)
        if (l->file[k] >= 0)
            l->offset[k] += l->header_len[l->file[k]];
    free(e);
    return 0;
oom:
    free(e);
    return -1;
}

static void mf_hx_file_name(const mf_hx_layout *l, int f, char *buf, size_t size)
{
    if (l->nfiles == 1)
        snprintf(buf, size, "model.safetensors");
    else
        snprintf(buf, size, "model-%05d-of-%05d.safetensors", f + 1, l->nfiles);
}

/* Rank 0: the files with their headers at full size, and the index. */
static int mf_hx_prepare(const mf_ckpt_plan *p, const mf_hx_layout *l, const char *tmp, char *err, size_t errlen)
{
    char path[4400], fn[64];
    for (int f = 0; f < l->nfiles; f++) {
        mf_hx_file_name(l, f, fn, sizeof fn);
        snprintf(path, sizeof path, "%s/%s", tmp, fn);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        int ok = fd >= 0 && ftruncate(fd, (off_t)l->bytes[f]) == 0 &&
                 mf_ckpt_pwrite_all(fd, l->header[f], l->header_len[f], 0) == 0 && fsync(fd) == 0;
        if (fd >= 0 && close(fd) != 0)
            ok = 0;
        if (!ok)
            return snprintf(err, errlen, "%.4000s: %s", path, strerror(errno)), -1;
    }
    if (l->nfiles == 1)
        return 0;
    json_t *root = json_pack("{s{sI}s{}}", "metadata", "total_size", (json_int_t)0, "weight_map");
    json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
    uint64_t total = 0;
    for (int k = 0; wm && k < p->ntensors; k++)
        if (l->file[k] >= 0) {
            mf_hx_file_name(l, l->file[k], fn, sizeof fn);
            json_object_set_new(wm, l->hf_name[k], json_string(fn));
        }
    for (int f = 0; f < l->nfiles; f++)
        total += l->bytes[f] - l->header_len[f];
    if (root)
        json_object_set_new(json_object_get(root, "metadata"), "total_size", json_integer((json_int_t)total));
    char *text = wm ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return snprintf(err, errlen, "out of memory"), -1;
    int rc = mf_ckpt_write_small(tmp, "model.safetensors.index.json", text, strlen(text), err, errlen);
    free(text);
    return rc;
}

/* This rank's pieces of the save plan, converted, into the files. */
static int mf_hx_write(mf_rt *rt, const mf_ckpt_plan *p, const mf_hx_layout *l, mf_dtype dt, const char *tmp,
                       char *err, size_t errlen)
{
    int *fds = malloc((size_t)l->nfiles * sizeof *fds), rc = -1, staged = mf_ckpt_staged(rt);
    uint8_t *bounce = malloc((size_t)1 << 20), *host = staged ? malloc((size_t)1 << 20) : NULL;
    char path[4400], fn[64], msg[256] = "";
    size_t ds = mf_dtype_size(dt);
    if (!fds || !bounce || (staged && !host)) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (int f = 0; f < l->nfiles; f++)
        fds[f] = -1;
    for (int64_t i = p->first[rt->rank]; i < p->first[rt->rank + 1]; i++) {
        const mf_ckpt_piece *pc = &p->p[i];
        int f = l->file[pc->tensor];
        if (f < 0)
            continue; /* tied: stored once, as its source */
        int k = mfsdp_tensor_find(rt, p->t[pc->tensor].name);
        const mfsdp_tensor_view *v = &rt->views[k];
        mf_dtype sd = (mf_dtype)v->main_weight_dtype;
        if (fds[f] < 0) {
            mf_hx_file_name(l, f, fn, sizeof fn);
            snprintf(path, sizeof path, "%s/%s", tmp, fn);
            if ((fds[f] = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
                snprintf(err, errlen, "%.4000s: %s", path, strerror(errno));
                goto done;
            }
        }
        size_t ss = mf_dtype_size(sd);
        int64_t per = (int64_t)(((size_t)1 << 20) / (ds > ss ? ds : ss));
        for (int64_t a = pc->start; a < pc->end; a += per) {
            int64_t n = pc->end - a < per ? pc->end - a : per;
            const char *from = (const char *)v->main_weight + (size_t)(a - v->shard_offset) * ss;
            if (staged) { /* buffer memory only through the stage hook (mf_ckpt_stage.h) */
                if (rt->be->stage(rt, host, from, (size_t)n * ss, msg, sizeof msg) != MFSDP_OK) {
                    snprintf(err, errlen, "copying buffer memory to host memory failed: %s", msg);
                    goto done;
                }
                from = (const char *)host;
            }
            mf_dtype_convert(bounce, dt, from, sd, n);
            if (mf_ckpt_pwrite_all(fds[f], bounce, (size_t)n * ds, l->offset[pc->tensor] + (uint64_t)a * ds) != 0) {
                snprintf(err, errlen, "write error: %s", strerror(errno));
                goto done;
            }
        }
    }
    rc = 0;
    for (int f = 0; f < l->nfiles; f++)
        if (fds[f] >= 0 && fsync(fds[f]) != 0 && rc == 0)
            rc = -1, snprintf(err, errlen, "fsync: %s", strerror(errno));
done:
    for (int f = 0; fds && f < l->nfiles; f++)
        if (fds[f] >= 0)
            close(fds[f]);
    free(fds);
    free(bounce);
    free(host);
    return rc;
}

static mfsdp_result mf_hx_round(mf_rt *rt, const mf_hx_msg *mine, mf_hx_msg *all, const char *own)
{
    mfsdp_result res = rt->be->exchange(rt, mine, sizeof *mine, all);
    if (res != MFSDP_OK)
        return mf_base_set_error(rt, res, "Hugging Face export: exchange between ranks failed: %s",
                               mfsdp_last_error(rt));
    if (mine->status != MFSDP_OK)
        return mf_base_set_error(rt, (mfsdp_result)mine->status, "Hugging Face export failed: %s", own);
    for (int64_t r = 0; r < rt->world; r++)
        if (all[r].status != MFSDP_OK)
            return mf_base_set_error(rt, (mfsdp_result)all[r].status, "Hugging Face export failed: rank %" PRId64
                                   ": %.*s", r, (int)sizeof all[r].msg, all[r].msg);
    return MFSDP_OK;
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
        snprintf(dir, sizeof dir, "%.*s", (int)mf_ckpt_dir_len(dir_arg), dir_arg);
    if (!rt)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_ckpt_export_hf: NULL runtime");
    mf_hx_msg mine = {0}, *all = calloc((size_t)rt->world, sizeof *all);
    mf_ckpt_plan p = {0};
    mf_hx_layout l = {0};
    mf_hf_rules rules = {0};
    char err[4096] = "", tmp[4200] = "";
    int have_plan = 0, have_layout = 0;
    int bad_abi = opt && MF_ABI_CHECK(mfsdp_hf_options, opt, err, sizeof err) != MFSDP_OK, bad = bad_abi;
    for (int i = 0; !bad && opt && i < opt->nmaps; i++)
        bad = !opt->maps || !opt->maps[i] || mf_hf_rule_add(&rules, 0, opt->maps[i]) != 0;
    for (int i = 0; !bad && opt && i < opt->nties; i++)
        bad = !opt->ties || !opt->ties[i] || mf_hf_rule_add(&rules, 1, opt->ties[i]) != 0;
    mfsdp_result res = MFSDP_ERR_OUT_OF_MEMORY;
    if (!all) {
        res = mf_base_set_error(rt, res, "out of memory");
        goto done;
    }
    mfsdp_result sr = MFSDP_OK;
    if (mf_ckpt_staged(rt) && (sr = mf_ckpt_stage_begin(rt, err, sizeof err)) != MFSDP_OK)
        mf_hx_fail(&mine, sr, err);
    else if (bad_abi)
        mf_hx_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
    else if (!dir_arg || bad || mfsdp_dtype_size(dtype) == 0)
        snprintf(err, sizeof err, "needs a directory, a dtype and rules FROM=TO / NAME=SOURCE"),
            mf_hx_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
    else if (mf_ckpt_plan_build(rt->s, &p, err, sizeof err) != 0 || !(have_plan = 1) ||
             mf_hx_layout_build(&p, &rules, (mf_dtype)dtype, max_file_bytes ? max_file_bytes : MF_HF_MAX_FILE_BYTES,
                                &l) != 0 || !(have_layout = 1))
        snprintf(err, sizeof err, "out of memory (layout)"), mf_hx_fail(&mine, MFSDP_ERR_OUT_OF_MEMORY, err);
    for (int i = 0; mine.status == MFSDP_OK && i < rules.ntie; i++) {
        int s = mf_ckpt_plan_find(&p, rules.tie_src[i]), t = mf_ckpt_plan_find(&p, rules.tie[i]);
        if (s < 0 || t < 0 || p.t[s].numel != p.t[t].numel || mf_hx_tied(&rules, rules.tie_src[i]))
            snprintf(err, sizeof err, "tie %s=%s: not two tensors of one size", rules.tie[i], rules.tie_src[i]),
                mf_hx_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
    }
    if (mine.status == MFSDP_OK && rt->rank == 0) {
        struct stat st;
        mf_ckpt_new_id(mine.id);
        snprintf(tmp, sizeof tmp, "%.4000s.tmp-%s", dir, mine.id);
        if (stat(dir, &st) == 0)
            snprintf(err, sizeof err, "%.4000s already exists", dir), mf_hx_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
        else if (mkdir(tmp, 0755) != 0 || mf_hx_prepare(&p, &l, tmp, err, sizeof err) != 0)
            mf_hx_fail(&mine, MFSDP_ERR_BACKEND, err[0] ? err : "cannot create the temporary directory");
    }
    res = mf_hx_round(rt, &mine, all, err);
    if (res == MFSDP_OK) {
        snprintf(tmp, sizeof tmp, "%.4000s.tmp-%.32s", dir, all[0].id);
        memset(&mine, 0, sizeof mine);
        if (mf_hx_write(rt, &p, &l, (mf_dtype)dtype, tmp, err, sizeof err) != 0)
            mf_hx_fail(&mine, MFSDP_ERR_BACKEND, err);
        res = mf_hx_round(rt, &mine, all, err);
        memset(&mine, 0, sizeof mine);
        if (rt->rank == 0 && res == MFSDP_OK && mf_ckpt_commit_dir(tmp, dir, err, sizeof err) != 0)
            mf_hx_fail(&mine, MFSDP_ERR_BACKEND, err);
        if (res == MFSDP_OK)
            res = mf_hx_round(rt, &mine, all, err);
    }
    if (rt->rank == 0 && res != MFSDP_OK && tmp[0]) /* (absent after a commit: harmless) */
        mf_ckpt_remove_dir(tmp);
done:
    if (have_layout)
        mf_hx_free(&l, p.ntensors);
    if (have_plan)
        mf_ckpt_plan_free(&p);
    for (int i = 0; i < rules.n; i++)
        free((char *)rules.from[i]);
    for (int i = 0; i < rules.ntie; i++)
        free((char *)rules.tie[i]);
    free(all);
    return res;
}
