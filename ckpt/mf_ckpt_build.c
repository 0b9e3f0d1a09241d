/*
 * mf_ckpt_build: a save's file entries and manifest from its plan (see the
 * header).
 */
#include "mf_ckpt_build.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

void mf_ckpt_build_file_name(int64_t r, char *buf, size_t size)
{
    snprintf(buf, size, "rank-%05" PRId64 ".safetensors", r);
}

void mf_ckpt_build_entries_free(mf_ckpt_wentry *e, int n)
{
    for (int i = 0; e && i < n; i++)
        free(e[i].name);
    free(e);
}

int mf_ckpt_build_entries(const mf_ckpt_plan *p, int64_t r, const mf_ckpt_states *st, uint64_t blob_bytes,
                          mf_ckpt_wentry **out, int *n)
{
    int64_t np = p->first[r + 1] - p->first[r];
    mf_ckpt_wentry *e = calloc((size_t)(np * st->n + 2), sizeof *e);
    *out = NULL;
    *n = 0;
    if (!e)
        return -1;
    int k = 0;
    for (int s = 0; s < st->n; s++)
        for (int64_t i = p->first[r]; i < p->first[r + 1]; i++) {
            const mf_ckpt_piece *pc = &p->p[i];
            const mf_ckpt_ptensor *pt = &p->t[pc->tensor];
            mf_ckpt_wentry *w = &e[k++];
            int64_t g = mf_ckpt_plan_gstart(pt, pc->start); /* the piece in the checkpoint tensor */
            if (asprintf(&w->name, "%s:%s[%" PRId64 ":%" PRId64 "]", st->name[s], pt->name, g,
                         g + (pc->end - pc->start)) < 0) {
                w->name = NULL;
                mf_ckpt_build_entries_free(e, k);
                return -1;
            }
            w->dtype = mf_ckpt_st_dtype(st->dtype[s]);
            w->ndims = 1;
            w->shape[0] = pc->end - pc->start;
            w->bytes = (uint64_t)(pc->end - pc->start) * mf_dtype_size(st->dtype[s]);
        }
    if (blob_bytes) {
        mf_ckpt_wentry *w = &e[k++];
        w->name = strdup("user_blob");
        w->dtype = MF_ST_U8;
        w->ndims = 1;
        w->shape[0] = (int64_t)blob_bytes;
        w->bytes = blob_bytes;
        if (!w->name) {
            mf_ckpt_build_entries_free(e, k);
            return -1;
        }
    }
    *out = e;
    *n = k;
    return 0;
}

char *mf_ckpt_build_manifest(const mf_schedule *s, const mf_ckpt_plan *p, const mf_ckpt_states *st,
                             const char *id, int64_t step, const mf_ckpt_report *rep)
{
    int64_t world = s->mesh.world;
    mf_ckpt_manifest m = {0};
    m.version = MF_CKPT_VERSION;
    snprintf(m.id, sizeof m.id, "%s", id);
    m.step = step;
    for (int i = 0; i < 32; i++)
        snprintf(m.schedule_sha256 + 2 * i, 3, "%02x", s->hash[i]);
    m.naxes = s->mesh.naxes;
    for (int a = 0; a < m.naxes; a++) {
        m.axis_name[a] = (char *)s->mesh.axes[a].name;
        m.axis_size[a] = s->mesh.axes[a].size;
    }
    m.world = world;
    m.nstates = st->n;
    m.ntensors = p->nmt;
    m.states = calloc((size_t)st->n, sizeof *m.states);
    m.tensors = calloc((size_t)p->ntensors + 1, sizeof *m.tensors);
    m.files = calloc((size_t)world, sizeof *m.files);
    m.pieces = calloc((size_t)(p->npieces * st->n + 1), sizeof *m.pieces);
    char *text = NULL, (*names)[48] = calloc((size_t)world, sizeof *names);
    if (!m.states || !m.tensors || !m.files || !m.pieces || !names)
        goto done;
    for (int i = 0; i < st->n; i++)
        m.states[i] = (mf_ckpt_mstate){(char *)st->name[i], st->dtype[i]};
    for (int k = 0; k < p->ntensors; k++) { /* split: the first combination's names W */
        mf_ckpt_mtensor *mt = &m.tensors[p->t[k].mt];
        mt->name = (char *)p->t[k].name;
        mt->ndims = p->t[k].ndims;
        memcpy(mt->dims, p->t[k].gdims, sizeof mt->dims);
    }
    for (int64_t r = 0; r < world; r++) {
        if (!rep[r].has_file)
            continue;
        mf_ckpt_mfile *f = &m.files[m.nfiles++];
        mf_ckpt_build_file_name(r, names[r], sizeof names[r]);
        *f = (mf_ckpt_mfile){names[r], r, rep[r].bytes, rep[r].crc32c, (int)m.npieces, 0, 0, rep[r].blob_bytes};
        uint64_t at = rep[r].header_bytes;
        for (int s2 = 0; s2 < st->n; s2++)
            for (int64_t i = p->first[r]; i < p->first[r + 1]; i++) {
                const mf_ckpt_piece *pc = &p->p[i];
                int64_t g = mf_ckpt_plan_gstart(&p->t[pc->tensor], pc->start);
                m.pieces[m.npieces++] =
                    (mf_ckpt_mpiece){s2, p->t[pc->tensor].mt, m.nfiles - 1, g, g + (pc->end - pc->start), at};
                at += (uint64_t)(pc->end - pc->start) * mf_dtype_size(st->dtype[s2]);
                f->npieces++;
            }
        f->blob_offset = at;
    }
    text = mf_ckpt_manifest_dump(&m);
done:
    free(names);
    free(m.states);
    free(m.tensors);
    free(m.files);
    free(m.pieces);
    return text;
}

void mf_ckpt_build_new_id(char id[33])
{
    uint8_t b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        for (int i = 0; i < 16; i++)
            b[i] = (uint8_t)(t >> (8 * (i % 8))) ^ (uint8_t)(i * 37);
    }
    for (int i = 0; i < 16; i++)
        snprintf(id + 2 * i, 3, "%02x", b[i]);
}

int mf_ckpt_build_begin_dir(const char *out, char id[33], char *tmp, size_t tmplen, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(out, &sb) == 0)
        return snprintf(err, errlen, "%s already exists (a checkpoint is never overwritten)", out), -1;
    mf_ckpt_build_new_id(id);
    if ((size_t)snprintf(tmp, tmplen, "%s.tmp-%s", out, id) >= tmplen)
        return snprintf(err, errlen, "%.200s...: the name is too long", out), -1;
    if (mkdir(tmp, 0755) != 0)
        return snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno)), -1;
    return 0;
}

int mf_ckpt_build_finish_dir(const mf_schedule *s, const mf_ckpt_plan *p, const mf_ckpt_states *st, const char *id,
                             int64_t step, const mf_ckpt_report *rep, const char *tmp, const char *out, char *err,
                             size_t errlen)
{
    char *text = mf_ckpt_build_manifest(s, p, st, id, step, rep);
    if (!text)
        return snprintf(err, errlen, "out of memory (manifest)"), -1;
    int rc = mf_ckpt_write_small(tmp, MF_CKPT_MANIFEST, text, strlen(text), err, errlen) != 0 ||
             mf_ckpt_write_commit_dir(tmp, out, err, errlen) != 0 ? -1 : 0;
    free(text);
    return rc;
}
