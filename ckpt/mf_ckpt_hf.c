/*
 * mf_ckpt_hf: Hugging Face checkpoints: open, name rules, match, ranged
 * converting reads (see the header; the export's layout is
 * mf_ckpt_hf_layout.c).
 */
#include "mf_ckpt_hf.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mf_ckpt_io.h"
#include "mf_dtype.h"

int mf_ckpt_hf_rule_add(mf_hf_rules *r, int kind, const char *arg)
{
    const char *eq = strchr(arg, '=');
    int *n = kind ? &r->ntie : &r->n;
    if (!eq || *n >= MF_HF_MAX_RULES || (kind && (eq == arg || !eq[1])))
        return -1;
    char *from = strndup(arg, (size_t)(eq - arg));
    if (!from)
        return -1;
    if (kind) {
        r->tie[*n] = from;
        r->tie_src[*n] = eq + 1;
    } else {
        r->from[*n] = from;
        r->to[*n] = eq + 1;
    }
    (*n)++;
    return 0;
}

int mf_hf_rules_add(mf_hf_rules *r, int nmaps, const char *const *maps, int nties, const char *const *ties)
{
    for (int i = 0; i < nmaps; i++)
        if (!maps || !maps[i] || mf_ckpt_hf_rule_add(r, 0, maps[i]) != 0)
            return -1;
    for (int i = 0; i < nties; i++)
        if (!ties || !ties[i] || mf_ckpt_hf_rule_add(r, 1, ties[i]) != 0)
            return -1;
    return 0;
}

void mf_hf_rules_free(mf_hf_rules *r)
{
    for (int i = 0; i < r->n; i++)
        free((char *)r->from[i]);
    for (int i = 0; i < r->ntie; i++)
        free((char *)r->tie[i]);
    memset(r, 0, sizeof *r);
}

int mf_hf_rules_tied(const mf_hf_rules *r, const char *name)
{
    for (int i = 0; i < r->ntie; i++)
        if (strcmp(r->tie[i], name) == 0)
            return 1;
    return 0;
}

/* The first rule whose prefix a[i] starts name rewrites it to b[i] + rest. */
static void mf_hf_rewrite(int n, const char *const *a, const char *const *b, const char *name, char *out,
                          size_t size)
{
    for (int i = 0; i < n; i++) {
        size_t k = strlen(a[i]);
        if (strncmp(name, a[i], k) == 0) {
            snprintf(out, size, "%s%s", b[i], name + k);
            return;
        }
    }
    snprintf(out, size, "%s", name);
}

void mf_ckpt_hf_to_sched(const mf_hf_rules *r, const char *hf, char *out, size_t size)
{
    mf_hf_rewrite(r->n, r->from, r->to, hf, out, size);
}

void mf_ckpt_hf_to_hf(const mf_hf_rules *r, const char *name, char *out, size_t size)
{
    mf_hf_rewrite(r->n, r->to, r->from, name, out, size);
}

void mf_hf_shape_init(mf_hf_shape *t, const char *name, int ndims, const int64_t *dims, int64_t numel)
{
    *t = (mf_hf_shape){.name = name, .ndims = ndims, .numel = numel};
    memcpy(t->dims, dims, (size_t)ndims * sizeof *dims);
}

mf_hf_shape *mf_ckpt_hf_shapes_of_plan(const mf_ckpt_plan *p)
{
    mf_hf_shape *t = calloc((size_t)p->ntensors + 1, sizeof *t);
    for (int k = 0; t && k < p->ntensors; k++) {
        int64_t numel = 1;
        for (int d = 0; d < p->t[k].ndims; d++)
            numel *= p->t[k].gdims[d];
        mf_hf_shape_init(&t[k], p->t[k].name, p->t[k].ndims, p->t[k].gdims, numel);
    }
    return t;
}

mf_hf_shape *mf_ckpt_hf_shapes_of_manifest(const mf_ckpt_manifest *m)
{
    mf_hf_shape *t = calloc((size_t)m->ntensors + 1, sizeof *t);
    for (int k = 0; t && k < m->ntensors; k++)
        mf_hf_shape_init(&t[k], m->tensors[k].name, m->tensors[k].ndims, m->tensors[k].dims, m->tensors[k].numel);
    return t;
}

void mf_ckpt_hf_close(mf_hf_model *m)
{
    for (int f = 0; f < m->nfiles; f++) {
        if (m->fds && m->fds[f] >= 0)
            close(m->fds[f]);
        if (m->paths)
            free(m->paths[f]);
    }
    for (int i = 0; m->t && i < m->n; i++)
        free(m->t[i].name);
    free(m->paths);
    free(m->fds);
    free(m->t);
    memset(m, 0, sizeof *m);
}

/* Adds the tensors of safetensors file `path` (only those named in `only`
 * when non-NULL: the index's entries for this file). */
static int mf_hf_add_file(mf_hf_model *m, const char *path, json_t *only, char *err, size_t errlen)
{
    int f = m->nfiles;
    char **np = realloc(m->paths, (size_t)(f + 1) * sizeof *np);
    int *nf = np ? realloc(m->fds, (size_t)(f + 1) * sizeof *nf) : NULL;
    if (np)
        m->paths = np;
    if (nf)
        m->fds = nf;
    if (!np || !nf || !(m->paths[f] = strdup(path)))
        return snprintf(err, errlen, "out of memory"), -1;
    struct stat st;
    m->fds[f] = mf_ckpt_io_open_regular(path, 0, &st, err, errlen);
    m->nfiles++;
    if (m->fds[f] < 0)
        return -1;
    mf_st_file h;
    if (mf_ckpt_st_read(m->fds[f], path, (uint64_t)st.st_size, &h, err, errlen) != 0)
        return -1;
    mf_hf_tensor *nt = realloc(m->t, (size_t)(m->n + h.n + 1) * sizeof *nt);
    if (!nt) {
        mf_ckpt_st_free(&h);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    m->t = nt;
    for (int i = 0; i < h.n; i++) {
        const mf_st_entry *e = &h.e[i];
        if (only && !json_object_get(only, e->name))
            continue;
        mf_hf_tensor *t = &m->t[m->n];
        *t = (mf_hf_tensor){.name = e->name, .file = f, .dtype = e->dtype, .ndims = e->ndims, .numel = e->numel,
                            .offset = h.data_start + e->begin};
        memcpy(t->dims, e->shape, sizeof t->dims);
        e = NULL;
        h.e[i].name = NULL; /* moved */
        m->n++;
    }
    mf_ckpt_st_free(&h);
    return 0;
}

/* The first name of `names` (the index's entries for one file) that is not
 * among tensors m->t[from..n): the one the file lacks. */
static const char *mf_hf_missing(const mf_hf_model *m, int from, json_t *names)
{
    const char *k;
    json_t *v;
    json_object_foreach(names, k, v) {
        int found = 0;
        for (int i = from; i < m->n && !found; i++)
            found = strcmp(m->t[i].name, k) == 0;
        if (!found)
            return k;
    }
    return "?";
}

/* model.safetensors.index.json: {"weight_map": {tensor: file}}. */
static int mf_hf_open_index(mf_hf_model *m, const char *path, char *err, size_t errlen)
{
    json_error_t je;
    int fd = mf_ckpt_io_open_regular(path, 0, NULL, err, errlen);
    if (fd < 0)
        return -1;
    json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    close(fd);
    if (!root)
        return snprintf(err, errlen, "%s: line %d, column %d: %s", path, je.line, je.column, je.text), -1;
    json_t *wm = json_object_get(root, "weight_map"), *byfile = json_object();
    int rc = -1;
    const char *k;
    json_t *v;
    if (!json_is_object(wm) || !byfile) {
        snprintf(err, errlen, "%s: no \"weight_map\" object", path);
        goto done;
    }
    json_object_foreach(wm, k, v) {
        const char *fn = json_string_value(v);
        if (!fn || strchr(fn, '/') || fn[0] == '.') {
            snprintf(err, errlen, "%s: weight_map[\"%s\"] is not a plain file name", path, k);
            goto done;
        }
        json_t *set = json_object_get(byfile, fn);
        if (!set) {
            set = json_object();
            json_object_set_new(byfile, fn, set);
        }
        json_object_set_new(set, k, json_true());
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    json_object_foreach(byfile, k, v) {
        char fp[8300];
        int before = m->n;
        snprintf(fp, sizeof fp, "%s%s", dir, k);
        if (mf_hf_add_file(m, fp, v, err, errlen) != 0)
            goto done;
        if ((size_t)(m->n - before) != json_object_size(v)) {
            snprintf(err, errlen, "%s: holds %d of the %zu tensors the index assigns to it: '%s' is not in it", fp,
                     m->n - before, json_object_size(v), mf_hf_missing(m, before, v));
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(byfile);
    json_decref(root);
    return rc;
}

int mf_ckpt_hf_open(const char *path, mf_hf_model *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    struct stat st;
    char buf[4200];
    if (stat(path, &st) != 0)
        return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    if (S_ISDIR(st.st_mode)) {
        snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (stat(buf, &st) != 0)
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
        path = buf;
    }
    size_t n = strlen(path);
    int rc = n > 5 && strcmp(path + n - 5, ".json") == 0 ? mf_hf_open_index(m, path, err, errlen)
                                                         : mf_hf_add_file(m, path, NULL, err, errlen);
    for (int i = 0; rc == 0 && i < m->n; i++)
        for (int j = i + 1; j < m->n; j++)
            if (strcmp(m->t[i].name, m->t[j].name) == 0) {
                snprintf(err, errlen, "%s: tensor '%s' is stored twice", path, m->t[i].name);
                rc = -1;
                break;
            }
    if (rc != 0)
        mf_ckpt_hf_close(m);
    return rc;
}

static void mf_hf_note(char *err, size_t errlen, int *bad, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void mf_hf_note(char *err, size_t errlen, int *bad, const char *fmt, ...)
{
    size_t at = strlen(err);
    va_list ap;
    va_start(ap, fmt);
    if (at + 8 < errlen) {
        if ((*bad)++)
            at += (size_t)snprintf(err + at, errlen - at, "\n  ");
        vsnprintf(err + at, errlen - at, fmt, ap);
    } else {
        (*bad)++;
    }
    va_end(ap);
}

int mf_ckpt_hf_match(const mf_hf_model *m, const mf_hf_rules *r, const mf_hf_shape *st, int n, int *src, char *err,
                     size_t errlen)
{
    int bad = 0;
    char name[1024];
    char *used = calloc((size_t)m->n + 1, 1);
    if (!used)
        return snprintf(err, errlen, "out of memory"), -1;
    err[0] = '\0';
    for (int k = 0; k < n; k++) {
        const char *want = st[k].name;
        for (int i = 0; i < r->ntie; i++)
            if (strcmp(r->tie[i], st[k].name) == 0)
                want = r->tie_src[i];
        src[k] = -1;
        for (int i = 0; i < m->n && src[k] < 0; i++) {
            mf_ckpt_hf_to_sched(r, m->t[i].name, name, sizeof name);
            if (strcmp(name, want) == 0)
                src[k] = i;
        }
        if (src[k] < 0) {
            mf_hf_note(err, errlen, &bad, "schedule tensor '%s': no Hugging Face tensor maps to '%s'", st[k].name,
                       want);
            continue;
        }
        const mf_hf_tensor *t = &m->t[src[k]];
        used[src[k]] = 1;
        if (t->ndims != st[k].ndims || memcmp(t->dims, st[k].dims, sizeof(int64_t) * (size_t)st[k].ndims) != 0)
            mf_hf_note(err, errlen, &bad, "schedule tensor '%s': Hugging Face tensor '%s' has another shape",
                       st[k].name, t->name);
        if (mf_ckpt_st_sched_dtype(t->dtype) < 0)
            mf_hf_note(err, errlen, &bad, "Hugging Face tensor '%s' is %s (only F32, BF16, F16)", t->name,
                       mf_st_dtype_name(t->dtype));
    }
    for (int i = 0; i < m->n; i++)
        if (!used[i]) {
            mf_ckpt_hf_to_sched(r, m->t[i].name, name, sizeof name);
            mf_hf_note(err, errlen, &bad, "Hugging Face tensor '%s' (as '%s') is not in the schedule", m->t[i].name,
                       name);
        }
    free(used);
    if (bad) {
        char *copy = strdup(err);
        if (copy) {
            snprintf(err, errlen, "%d tensors do not match:\n  %s", bad, copy);
            free(copy);
        }
        return -1;
    }
    return 0;
}

int mf_hf_model_read(const mf_hf_model *m, int t, int64_t start, int64_t end, void *dst, mf_dtype dst_dtype,
                     char *err, size_t errlen)
{
    const mf_hf_tensor *x = &m->t[t];
    int sd = mf_ckpt_st_sched_dtype(x->dtype);
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
        if (mf_ckpt_io_pread_all(m->fds[x->file], via, (size_t)k * es, x->offset + (uint64_t)a * es) != 0)
            return snprintf(err, errlen, "%s: read error: %s", m->paths[x->file], strerror(errno)), -1;
        if (via == bounce)
            mf_dtype_convert(to, dst_dtype, bounce, (mf_dtype)sd, k);
    }
    return 0;
}
