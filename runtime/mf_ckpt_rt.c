/*
 * mf_ckpt_rt: mfsdp_ckpt_save / mfsdp_ckpt_load / mfsdp_ckpt_verify
 * (mfsdp_ckpt.h, docs/checkpoint.md). The ranks agree through the
 * backend's small all-gather (be->exchange, as mfsdp_create does): three
 * rounds per save (directory ready, files written, committed), two per load
 * (checked, read). No tensor data crosses ranks.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "mf_ckpt_io.h"
#include "mf_ckpt_plan.h"
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
        return mf_rt_set_error(rt, res, "checkpoint %s: exchange between ranks failed: %s", what,
                               mfsdp_last_error(rt));
    for (int64_t r = 0; r < rt->world; r++)
        if (all[r].status != MFSDP_OK)
            return mf_rt_set_error(rt, (mfsdp_result)all[r].status, "checkpoint %s: rank %" PRId64 ": %.*s",
                                   what, r, (int)sizeof all[r].msg, all[r].msg);
    return MFSDP_OK;
}

static void mf_ckpt_fail(mf_ckpt_msg *m, mfsdp_result code, const char *text)
{
    m->status = code;
    size_t n = strlen(text);
    if (n >= sizeof m->msg)
        n = sizeof m->msg - 1;
    memcpy(m->msg, text, n);
    m->msg[n] = '\0';
}

/* The runtime's tensor index of every plan tensor. */
static int mf_ckpt_map(mf_rt *rt, const mf_ckpt_plan *p, int *map)
{
    for (int k = 0; k < p->ntensors; k++)
        if ((map[k] = mfsdp_tensor_find(rt, p->t[k].name)) < 0)
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
        if (!st[i].name || !mf_ckpt_state_name_ok(st[i].name) || strcmp(st[i].name, "main_weight") == 0 ||
            mfsdp_dtype_size(st[i].dtype) == 0 || !st[i].shards)
            return snprintf(err, errlen, "state %d: needs a name of [A-Za-z0-9_.-] other than main_weight, a "
                            "dtype and a shards array", i), -1;
        for (int j = 0; j < i; j++)
            if (strcmp(st[i].name, st[j].name) == 0)
                return snprintf(err, errlen, "state %d: duplicate name '%s'", i, st[i].name), -1;
    }
    return 0;
}

/* Writes this rank's data file into the temporary directory. */
static int mf_ckpt_save_file(mf_ckpt_saver *sv, mf_ckpt_msg *out, char *err, size_t errlen)
{
    mf_rt *rt = sv->rt;
    const mf_ckpt_plan *p = &sv->plan;
    int64_t r = rt->rank, np = p->first[r + 1] - p->first[r];
    int nst = 1 + sv->opt->nstates, n = 0, rc = -1;
    mf_ckpt_wentry *e = calloc((size_t)(np * nst + 2), sizeof *e);
    if (!e)
        return snprintf(err, errlen, "out of memory"), -1;
    for (int s = 0; s < nst; s++)
        for (int64_t i = p->first[r]; i < p->first[r + 1]; i++) {
            const mf_ckpt_piece *pc = &p->p[i];
            mfsdp_tensor_view *v = &rt->views[sv->map[pc->tensor]];
            const char *sname = s ? sv->opt->states[s - 1].name : "main_weight";
            mfsdp_dtype dt = s ? sv->opt->states[s - 1].dtype : v->main_weight_dtype;
            const char *base = s ? sv->opt->states[s - 1].shards[sv->map[pc->tensor]] : v->main_weight;
            if (pc->start < v->shard_offset || pc->end > v->shard_offset + v->shard_count || !base) {
                snprintf(err, errlen, "internal: piece [%lld, %lld) of %s is not in this rank's shard or the "
                         "state's shard pointer is NULL", (long long)pc->start, (long long)pc->end, v->name);
                goto done;
            }
            size_t es = mfsdp_dtype_size(dt);
            mf_ckpt_wentry *w = &e[n++];
            if (asprintf(&w->name, "%s:%s[%lld:%lld]", sname, v->name, (long long)pc->start,
                         (long long)pc->end) < 0) {
                w->name = NULL;
                snprintf(err, errlen, "out of memory");
                goto done;
            }
            w->dtype = mf_ckpt_st_dtype((mf_dtype)dt);
            w->ndims = 1;
            w->shape[0] = pc->end - pc->start;
            w->data = base + (size_t)(pc->start - v->shard_offset) * es;
            w->bytes = (uint64_t)(pc->end - pc->start) * es;
        }
    if (sv->opt->user_blob_bytes) {
        mf_ckpt_wentry *w = &e[n++];
        w->name = strdup("user_blob");
        w->dtype = MF_ST_U8;
        w->ndims = 1;
        w->shape[0] = (int64_t)sv->opt->user_blob_bytes;
        w->data = sv->opt->user_blob;
        w->bytes = sv->opt->user_blob_bytes;
        if (!w->name) {
            snprintf(err, errlen, "out of memory");
            goto done;
        }
    }
    rc = 0;
    if (n > 0) {
        char path[4096];
        mf_ckpt_written wr;
        snprintf(path, sizeof path, "%s/rank-%05" PRId64 ".safetensors", sv->tmp, r);
        rc = mf_ckpt_write_file(path, e, n, sv->id, r, NULL, NULL, &wr, err, errlen);
        out->has_file = rc == 0;
        out->bytes = wr.bytes;
        out->header_bytes = wr.header_bytes;
        out->crc = wr.crc32c;
        out->blob_bytes = sv->opt->user_blob_bytes;
    }
done:
    for (int i = 0; i < n; i++)
        free(e[i].name);
    free(e);
    return rc;
}

/* Rank 0: the manifest from the plan and every rank's report. */
static int mf_ckpt_save_manifest(mf_ckpt_saver *sv, const mf_ckpt_msg *all, char *err, size_t errlen)
{
    mf_rt *rt = sv->rt;
    const mf_schedule *s = rt->s;
    const mf_ckpt_plan *p = &sv->plan;
    int nst = 1 + sv->opt->nstates, rc = -1;
    mf_ckpt_manifest m = {0};
    m.version = MF_CKPT_VERSION;
    memcpy(m.id, sv->id, sizeof m.id);
    m.step = sv->opt->step;
    for (int i = 0; i < 32; i++)
        snprintf(m.schedule_sha256 + 2 * i, 3, "%02x", s->hash[i]);
    m.naxes = s->mesh.naxes;
    for (int a = 0; a < m.naxes; a++) {
        m.axis_name[a] = (char *)s->mesh.axes[a].name;
        m.axis_size[a] = s->mesh.axes[a].size;
    }
    m.world = rt->world;
    m.nstates = nst;
    m.ntensors = p->ntensors;
    m.states = calloc((size_t)nst, sizeof *m.states);
    m.tensors = calloc((size_t)p->ntensors + 1, sizeof *m.tensors);
    m.files = calloc((size_t)rt->world, sizeof *m.files);
    m.pieces = calloc((size_t)(p->npieces * nst + 1), sizeof *m.pieces);
    char *text = NULL, (*names)[48] = calloc((size_t)rt->world, sizeof *names);
    if (!m.states || !m.tensors || !m.files || !m.pieces || !names)
        goto oom;
    m.states[0] = (mf_ckpt_mstate){"main_weight", p->ntensors ? p->t[0].dtype : MF_FP32};
    for (int i = 1; i < nst; i++)
        m.states[i] = (mf_ckpt_mstate){(char *)sv->opt->states[i - 1].name, (mf_dtype)sv->opt->states[i - 1].dtype};
    for (int k = 0; k < p->ntensors; k++) {
        m.tensors[k].name = (char *)p->t[k].name;
        m.tensors[k].ndims = p->t[k].ndims;
        memcpy(m.tensors[k].dims, p->t[k].dims, sizeof m.tensors[k].dims);
    }
    for (int64_t r = 0; r < rt->world; r++) {
        if (!all[r].has_file)
            continue;
        mf_ckpt_mfile *f = &m.files[m.nfiles++];
        snprintf(names[r], sizeof names[r], "rank-%05" PRId64 ".safetensors", r);
        *f = (mf_ckpt_mfile){names[r], r, all[r].bytes, all[r].crc, (int)m.npieces, 0, 0, all[r].blob_bytes};
        uint64_t at = all[r].header_bytes;
        for (int st = 0; st < nst; st++)
            for (int64_t i = p->first[r]; i < p->first[r + 1]; i++) {
                const mf_ckpt_piece *pc = &p->p[i];
                m.pieces[m.npieces++] = (mf_ckpt_mpiece){st, pc->tensor, m.nfiles - 1, pc->start, pc->end, at};
                at += (uint64_t)(pc->end - pc->start) * mf_dtype_size(m.states[st].dtype);
                f->npieces++;
            }
        f->blob_offset = at;
    }
    text = mf_ckpt_manifest_dump(&m);
    if (!text)
        goto oom;
    rc = mf_ckpt_write_small(sv->tmp, MF_CKPT_MANIFEST, text, strlen(text), err, errlen);
    goto done;
oom:
    snprintf(err, errlen, "out of memory (manifest)");
done:
    free(text);
    free(names);
    free(m.states);
    free(m.tensors);
    free(m.files);
    free(m.pieces);
    return rc;
}

static void mf_ckpt_new_id(char id[33])
{
    uint8_t b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t t = (uint64_t)mf_rt_now_ns();
        for (int i = 0; i < 16; i++)
            b[i] = (uint8_t)(t >> (8 * (i % 8))) ^ (uint8_t)(i * 37);
    }
    for (int i = 0; i < 16; i++)
        snprintf(id + 2 * i, 3, "%02x", b[i]);
}

/* Round 1 on rank 0: the id and the temporary directory. */
static void mf_ckpt_save_prepare(mf_ckpt_saver *sv, const char *dir, mf_ckpt_msg *mine)
{
    struct stat st;
    char path[4096];
    mf_ckpt_new_id(mine->id);
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

mfsdp_result mfsdp_ckpt_save(mfsdp_runtime *rt, const char *dir, const mfsdp_ckpt_save_options *opt)
{
    if (!rt)
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_ckpt_save: NULL runtime");
    mf_ckpt_saver sv = {.rt = rt, .opt = opt};
    mf_ckpt_msg mine = {0}, *all = calloc((size_t)rt->world, sizeof *all);
    char err[1024];
    mfsdp_result res;
    if (!all)
        return mf_rt_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory");
    if (rt->native)
        mf_ckpt_fail(&mine, MFSDP_ERR_UNSUPPORTED, "checkpoints need host-memory master weights (local, mpi)");
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
            mf_ckpt_remove_dir(path);
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
                                mf_ckpt_commit_dir(sv.tmp, dir, err, sizeof err) != 0))
            mf_ckpt_fail(&mine, MFSDP_ERR_BACKEND, err);
        if (res != MFSDP_OK || mine.status != MFSDP_OK)
            mf_ckpt_remove_dir(sv.tmp);
    }
    if (res == MFSDP_OK)
        res = mf_ckpt_round(rt, &mine, all, "commit");
done:
    free(sv.tmp);
    free(sv.map);
    mf_ckpt_plan_free(&sv.plan);
    free(all);
    return res;
}
