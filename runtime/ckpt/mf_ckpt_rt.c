/*
 * mf_ckpt_rt: mfsdp_ckpt_save / mfsdp_ckpt_load / mfsdp_ckpt_verify
 * (mfsdp_ckpt.h, docs/checkpoint.md). The ranks agree through the
 * backend's small all-gather (be->exchange, as mfsdp_create does): three
 * rounds per save (directory ready, files written, committed); no tensor
 * data crosses ranks in a save. The load (mf_ckpt_load.c) agrees in two
 * rounds (checked, read; plus the buffer addresses' all-gather with shared
 * memory) and moves the pieces one replica read to the others while it
 * reads (mf_ckpt_share.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_agree.h"
#include "mf_abi.h"
#include "mf_ckpt_global.h"
#include "mf_ckpt_build.h"
#include "mf_diag.h"
#include "mf_ckpt_stage.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

/* What a rank sends in each round (at most the local backend's 256 bytes). */
typedef struct mf_ckpt_msg {
    int64_t status;         /* mfsdp_result */
    uint64_t bytes, header_bytes, blob_bytes;
    uint32_t crc, has_file;
    char id[40];
    char msg[176];
} mf_ckpt_msg;

_Static_assert(sizeof(mf_ckpt_msg) <= 256, "exchange limit");

/* One round: sends mine, fills all[world]; on a failed exchange or any
 * rank's failure returns that failure (set on rt, naming the rank). */
static mfsdp_result mf_ckpt_round(mf_rt *rt, const mf_ckpt_msg *mine, mf_ckpt_msg *all, const char *what)
{
    mfsdp_result res = rt->be->exchange(rt, mine, sizeof *mine, all);
    if (res != MFSDP_OK)
        return mf_base_set_error(rt, res, "checkpoint %s: exchange between ranks failed: %s", what,
                               mfsdp_last_error(rt));
    for (int64_t r = 0; r < rt->world; r++)
        if (all[r].status != MFSDP_OK)
            return mf_base_set_error(rt, (mfsdp_result)all[r].status, "checkpoint %s: rank %" PRId64 ": %.*s",
                                   what, r, (int)sizeof all[r].msg, all[r].msg);
    return MFSDP_OK;
}

static void mf_ckpt_fail(mf_ckpt_msg *m, mfsdp_result code, const char *text)
{
    m->status = code;
    mf_diag_errf(m->msg, sizeof m->msg, "%s", text);   /* truncated to fit */
}

/* The runtime's tensor index of every plan tensor (by its local name: a
 * Distinct tensor's plan tensors, one per coordinate, share one). */
static int mf_ckpt_map(mf_rt *rt, const mf_ckpt_plan *p, int *map)
{
    for (int k = 0; k < p->ntensors; k++)
        if ((map[k] = mfsdp_tensor_find(rt, p->t[k].local)) < 0)
            return -1;
    return 0;
}

/* ---- save ---- */

typedef struct mf_ckpt_saver {
    mf_rt *rt;
    const mfsdp_ckpt_save_options *opt;
    mf_ckpt_plan plan;
    int *map;
    char *tmp;
    char id[33];
} mf_ckpt_saver;

static int mf_ckpt_check_states(int n, const mfsdp_ckpt_state *st, char *err, size_t errlen)
{
    if (n < 0 || n > 63 || (n > 0 && !st))
        return snprintf(err, errlen, "nstates must be 0..63 with a states array"), -1;
    for (int i = 0; i < n; i++) {
        if (!st[i].name || !mf_ckpt_manifest_state_name_ok(st[i].name) || strcmp(st[i].name, "main_weight") == 0 ||
            mfsdp_dtype_size(st[i].dtype) == 0 || !st[i].shards)
            return snprintf(err, errlen, "state %d: needs a name of [A-Za-z0-9_.-] other than main_weight, a "
                            "dtype and a shards array", i), -1;
        for (int j = 0; j < i; j++)
            if (strcmp(st[i].name, st[j].name) == 0)
                return snprintf(err, errlen, "state %d: duplicate name '%s'", i, st[i].name), -1;
    }
    return 0;
}

/* The save's states: main_weight, then the options' states. */
static void mf_ckpt_save_states(const mf_ckpt_saver *sv, mf_ckpt_states *st)
{
    st->n = 1 + sv->opt->nstates;
    st->name[0] = "main_weight";
    st->dtype[0] = sv->plan.ntensors ? sv->plan.t[0].dtype : MF_FP32;
    for (int i = 0; i < sv->opt->nstates; i++) {
        st->name[i + 1] = sv->opt->states[i].name;
        st->dtype[i + 1] = (mf_dtype)sv->opt->states[i].dtype;
    }
}

/* Writes this rank's data file into the temporary directory. */
static int mf_ckpt_save_file(mf_ckpt_saver *sv, mf_ckpt_msg *out, char *err, size_t errlen)
{
    mf_rt *rt = sv->rt;
    const mf_ckpt_plan *p = &sv->plan;
    int64_t r = rt->rank, np = p->first[r + 1] - p->first[r];
    mf_ckpt_states st;
    mf_ckpt_wentry *e = NULL;
    int n = 0, rc = -1;
    mf_ckpt_save_states(sv, &st);
    if (mf_ckpt_build_entries(p, r, &st, sv->opt->user_blob_bytes, &e, &n) != 0)
        return snprintf(err, errlen, "out of memory"), -1;
    /* Staged (buffer memory is not host memory, mf_ckpt_stage.h): the
     * buffers' entries are filled through the stage hook, by the writer's
     * bounded buffer. */
    mf_ckpt_stage_src stage = {rt, NULL};
    if (mf_ckpt_stage_active(rt) && !(stage.src = calloc((size_t)n + 1, sizeof *stage.src))) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < np * st.n; i++) {
        int s = (int)(i / np);
        const mf_ckpt_piece *pc = &p->p[p->first[r] + i % np];
        mfsdp_tensor_view *v = &rt->views[sv->map[pc->tensor]];
        const char *base = s ? sv->opt->states[s - 1].shards[sv->map[pc->tensor]] : v->main_weight;
        if (pc->start < v->shard_offset || pc->end > v->shard_offset + v->shard_count || !base) {
            snprintf(err, errlen, "piece [%lld, %lld) of %s is not in this rank's shard, or state %s has no "
                     "buffer for it", (long long)pc->start, (long long)pc->end, v->name, st.name[s]);
            goto done;
        }
        e[i].data = base + (size_t)(pc->start - v->shard_offset) * mf_dtype_size(st.dtype[s]);
        if (stage.src) {
            stage.src[i] = e[i].data;
            e[i].data = NULL;
        }
    }
    if (sv->opt->user_blob_bytes)
        e[n - 1].data = sv->opt->user_blob;
    rc = 0;
    if (n > 0) {
        char path[4096], name[48];
        mf_ckpt_written wr;
        mf_ckpt_build_file_name(r, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", sv->tmp, name);
        rc = mf_ckpt_write_file(path, e, n, sv->id, r, stage.src ? mf_ckpt_stage_fill : NULL, &stage, &wr, err,
                                errlen);
        out->has_file = rc == 0;
        out->bytes = wr.bytes;
        out->header_bytes = wr.header_bytes;
        out->crc = wr.crc32c;
        out->blob_bytes = sv->opt->user_blob_bytes;
    }
done:
    mf_ckpt_build_entries_free(e, n);
    free(stage.src);
    return rc;
}

/* Rank 0: the manifest from the plan and every rank's report. */
static int mf_ckpt_save_manifest(mf_ckpt_saver *sv, const mf_ckpt_msg *all, char *err, size_t errlen)
{
    mf_rt *rt = sv->rt;
    mf_ckpt_states st;
    mf_ckpt_report *rep = calloc((size_t)rt->world, sizeof *rep);
    char *text = NULL;
    int rc = -1;
    mf_ckpt_save_states(sv, &st);
    if (rep) {
        for (int64_t r = 0; r < rt->world; r++)
            rep[r] = (mf_ckpt_report){(int)all[r].has_file, all[r].bytes, all[r].header_bytes, all[r].blob_bytes,
                                      all[r].crc};
        text = mf_ckpt_build_manifest(rt->s, &sv->plan, &st, sv->id, sv->opt->step, rep);
    }
    if (text)
        rc = mf_ckpt_write_small(sv->tmp, MF_CKPT_MANIFEST, text, strlen(text), err, errlen);
    else
        snprintf(err, errlen, "out of memory (manifest)");
    free(text);
    free(rep);
    return rc;
}

/* Round 1 on rank 0: the id and the temporary directory. */
static void mf_ckpt_save_prepare(mf_ckpt_saver *sv, const char *dir, mf_ckpt_msg *mine)
{
    struct stat st;
    char path[4096];
    mf_ckpt_build_new_id(mine->id);
    snprintf(path, sizeof path, "%s.tmp-%s", dir, mine->id);
    char msg[4200];
    if (stat(dir, &st) == 0) {
        snprintf(msg, sizeof msg, "%s already exists (a checkpoint is never overwritten)", dir);
        mf_ckpt_fail(mine, MFSDP_ERR_INVALID_ARGUMENT, msg);
    } else if (mkdir(path, 0755) != 0) {
        snprintf(msg, sizeof msg, "cannot create %s: %s", path, strerror(errno));
        mf_ckpt_fail(mine, MFSDP_ERR_INVALID_ARGUMENT, msg);
    }
}

mfsdp_result mfsdp_ckpt_save(mfsdp_runtime *rt, const char *dir_arg, const mfsdp_ckpt_save_options *opt)
{
    mfsdp_result live = mf_base_handle_check(rt, "mfsdp_ckpt_save");
    if (live == MFSDP_OK)   /* every rank is at this call (docs/runtime.md §4.4) */
        live = mf_agree_helper(rt, "mfsdp_ckpt_save", 0);
    if (live == MFSDP_OK)
        live = mf_ckpt_global_check(rt, "mfsdp_ckpt_save");
    if (live != MFSDP_OK)
        return live;
    mf_ckpt_saver sv = {.rt = rt, .opt = opt};
    mf_ckpt_msg mine = {0}, *all = calloc((size_t)rt->world, sizeof *all);
    char err[1024];
    char *dir = dir_arg ? strndup(dir_arg, mf_ckpt_io_dir_len(dir_arg)) : NULL; /* "ckpt/" saves "ckpt" */
    mfsdp_result res;
    if (!all || (dir_arg && !dir)) {
        free(all);
        free(dir);
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (mf_ckpt_stage_active(rt) && (res = mf_ckpt_stage_begin(rt, err, sizeof err)) != MFSDP_OK)
        mf_ckpt_fail(&mine, res, err);
    else if (opt && MF_ABI_CHECK(mfsdp_ckpt_save_options, opt, err, sizeof err) != MFSDP_OK)
        mf_ckpt_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
    else if (!dir || !*dir || !opt || opt->step < 0 || (opt->user_blob_bytes && !opt->user_blob))
        mf_ckpt_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, "needs a directory and options (step >= 0, a blob "
                     "pointer with its size)");
    else if (mf_ckpt_check_states(opt->nstates, opt->states, err, sizeof err) != 0)
        mf_ckpt_fail(&mine, MFSDP_ERR_INVALID_ARGUMENT, err);
    else if (mf_ckpt_plan_build(rt->s, &sv.plan, err, sizeof err) != 0 ||
             !(sv.map = calloc((size_t)sv.plan.ntensors + 1, sizeof *sv.map)) || mf_ckpt_map(rt, &sv.plan, sv.map))
        mf_ckpt_fail(&mine, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (plan)");
    if (mine.status == MFSDP_OK && rt->rank == 0)
        mf_ckpt_save_prepare(&sv, dir, &mine);
    res = mf_ckpt_round(rt, &mine, all, "save");
    if (res != MFSDP_OK) {
        if (rt->rank == 0 && all[0].status == MFSDP_OK && dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s.tmp-%s", dir, all[0].id);
            mf_ckpt_io_remove_dir(path);
        }
        goto done;
    }
    memcpy(sv.id, all[0].id, 33);
    if (asprintf(&sv.tmp, "%s.tmp-%s", dir, sv.id) < 0)
        sv.tmp = NULL;
    memset(&mine, 0, sizeof mine);
    if (!sv.tmp)
        mf_ckpt_fail(&mine, MFSDP_ERR_OUT_OF_MEMORY, "out of memory");
    else if (mf_ckpt_save_file(&sv, &mine, err, sizeof err) != 0)
        mf_ckpt_fail(&mine, MFSDP_ERR_BACKEND, err);
    res = mf_ckpt_round(rt, &mine, all, "save");
    memset(&mine, 0, sizeof mine);
    if (rt->rank == 0) {
        if (res == MFSDP_OK && (mf_ckpt_save_manifest(&sv, all, err, sizeof err) != 0 ||
                                mf_ckpt_write_commit_dir(sv.tmp, dir, err, sizeof err) != 0))
            mf_ckpt_fail(&mine, MFSDP_ERR_BACKEND, err);
        if (res != MFSDP_OK || mine.status != MFSDP_OK)
            mf_ckpt_io_remove_dir(sv.tmp);
    }
    if (res == MFSDP_OK)
        res = mf_ckpt_round(rt, &mine, all, "commit");
done:
    free(dir);
    free(sv.tmp);
    free(sv.map);
    mf_ckpt_plan_free(&sv.plan);
    free(all);
    return res;
}
