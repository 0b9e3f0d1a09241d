/*
 * mfsdp-ckpt import / export: Hugging Face checkpoints (docs/checkpoint.md,
 * "Hugging Face"), streamed through bounded buffers.
 *
 *   import HF SCHEDULE.yaml OUT [--map FROM=TO]... [--tie NAME=SOURCE]...
 *       an mfsdp checkpoint (main_weight only, step 0) for the schedule
 *   export DIR OUT [--dtype bf16|fp16|fp32] [--map FROM=TO]... [--tie NAME=SOURCE]...
 *          [--max-file-bytes N]
 *       consolidated full tensors: OUT/model.safetensors, or
 *       OUT/model-0000k-of-0000N.safetensors + model.safetensors.index.json
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_backend.h"
#include "mf_ckpt_build.h"
#include "mf_ckpt_hf.h"
#include "mf_ckpt_hf_read.h"
#include "mf_load.h"
#include "mfsdp_ckpt_tool.h"

/* Parses the options after the positional arguments. */
static int ck_hf_opts(int argc, char **argv, int first, mf_hf_rules *r, int *dtype, uint64_t *maxb)
{
    for (int i = first; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return -1;
        if (!strcmp(a, "--map") && mf_hf_rule_add(r, 0, v) == 0)
            continue;
        if (!strcmp(a, "--tie") && mf_hf_rule_add(r, 1, v) == 0)
            continue;
        if (dtype && !strcmp(a, "--dtype") && mf_dtype_from_name(v) >= 0) {
            *dtype = mf_dtype_from_name(v);
            continue;
        }
        if (maxb && !strcmp(a, "--max-file-bytes") && strtoull(v, NULL, 10) > 0) {
            *maxb = strtoull(v, NULL, 10);
            continue;
        }
        fprintf(stderr, "mfsdp-ckpt: error: bad option %s %s\n", a, v);
        return -1;
    }
    return 0;
}

static void ck_hf_rules_free(mf_hf_rules *r)
{
    for (int i = 0; i < r->n; i++)
        free((char *)r->from[i]);
    for (int i = 0; i < r->ntie; i++)
        free((char *)r->tie[i]);
}

/* ---- import ---- */

typedef struct ck_imp {
    const mf_hf_model *m;
    const mf_ckpt_plan *p;
    const int *src;
    int64_t rank;
} ck_imp;

static int ck_imp_fill(void *ctx, int entry, uint64_t off, void *buf, size_t n, char *err, size_t errlen)
{
    ck_imp *c = ctx;
    const mf_ckpt_piece *pc = &c->p->p[c->p->first[c->rank] + entry];
    mf_dtype d = c->p->t[pc->tensor].dtype;
    int64_t a = pc->start + (int64_t)(off / mf_dtype_size(d));
    return mf_hf_read(c->m, c->src[pc->tensor], a, a + (int64_t)(n / mf_dtype_size(d)), buf, d, err, errlen);
}

int ck_import(int argc, char **argv)
{
    mf_hf_rules rules = {0};
    mf_hf_model m = {0};
    mf_ckpt_plan p = {0};
    mf_schedule *s = NULL;
    char err[8192] = "", tmp[4200], id[33];
    int rc = 1, made = 0, *src = NULL, *nd = NULL;
    const char **names = NULL;
    int64_t(*dims)[MF_MAX_DIMS] = NULL;
    mf_ckpt_report *rep = NULL;
    if (argc < 4 || ck_hf_opts(argc, argv, 4, &rules, NULL, NULL) != 0) {
        ck_hf_rules_free(&rules);
        return 2;
    }
    char *out = argv[3];
    out[mf_ckpt_dir_len(out)] = '\0'; /* "out/" writes "out" */
    if (mf_hf_open(argv[1], &m, err, sizeof err) != 0 || !(s = mf_schedule_load_file(argv[2], err, sizeof err)) ||
        mf_ckpt_plan_build(s, &p, err, sizeof err) != 0)
        goto fail;
    src = calloc((size_t)p.ntensors + 1, sizeof *src);
    nd = calloc((size_t)p.ntensors + 1, sizeof *nd);
    names = calloc((size_t)p.ntensors + 1, sizeof *names);
    dims = calloc((size_t)p.ntensors + 1, sizeof *dims);
    rep = calloc((size_t)p.world, sizeof *rep);
    if (!src || !nd || !names || !dims || !rep) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    for (int k = 0; k < p.ntensors; k++) {
        names[k] = p.t[k].name;
        nd[k] = p.t[k].ndims;
        memcpy(dims[k], p.t[k].dims, sizeof dims[k]);
    }
    if (mf_hf_match(&m, &rules, p.ntensors, names, nd, (const int64_t(*)[MF_MAX_DIMS])dims, src, err, sizeof err))
        goto fail;
    if (mf_ckpt_begin_dir(out, id, tmp, sizeof tmp, err, sizeof err) != 0)
        goto fail;
    made = 1;
    mf_ckpt_states st = {.n = 1, .name = {"main_weight"}, .dtype = {p.ntensors ? p.t[0].dtype : MF_FP32}};
    for (int64_t r = 0; r < p.world; r++) {
        mf_ckpt_wentry *e = NULL;
        int n = 0;
        if (mf_ckpt_entries(&p, r, &st, 0, &e, &n) != 0) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
        if (n > 0) {
            char path[8400], name[48];
            mf_ckpt_written wr;
            ck_imp c = {&m, &p, src, r};
            mf_ckpt_file_name(r, name, sizeof name);
            snprintf(path, sizeof path, "%s/%s", tmp, name);
            int w = mf_ckpt_write_file(path, e, n, id, r, ck_imp_fill, &c, &wr, err, sizeof err);
            rep[r] = (mf_ckpt_report){w == 0, wr.bytes, wr.header_bytes, 0, wr.crc32c};
            if (w != 0) {
                mf_ckpt_entries_free(e, n);
                goto fail;
            }
        }
        mf_ckpt_entries_free(e, n);
    }
    if (mf_ckpt_finish_dir(s, &p, &st, id, 0, rep, tmp, out, err, sizeof err) != 0)
        goto fail;
    made = 0;
    printf("imported %s -> %s: %d tensors for %" PRId64 " ranks\n", argv[1], out, p.ntensors, p.world);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "mfsdp-ckpt: error: %s\n", err);
done:
    if (made)
        mf_ckpt_remove_dir(tmp);
    free(rep);
    free(src);
    free(nd);
    free(names);
    free(dims);
    mf_ckpt_plan_free(&p);
    mf_schedule_free(s);
    mf_hf_close(&m);
    ck_hf_rules_free(&rules);
    return rc;
}

/* ---- export ---- */

typedef struct ck_exp {
    mf_ckpt_reader *r;
    const int *tensor;      /* entry -> manifest tensor */
    mf_dtype dtype;
    void *buf;              /* MF_CKPT_IO_CHUNK / 2 * 4 bytes: fp32 staging */
} ck_exp;

static int ck_exp_fill(void *ctx, int entry, uint64_t off, void *buf, size_t n, char *err, size_t errlen)
{
    ck_exp *c = ctx;
    mf_dtype sd = c->r->m.states[0].dtype;
    size_t ds = mf_dtype_size(c->dtype);
    int64_t a = (int64_t)(off / ds), k = (int64_t)(n / ds);
    for (int64_t at = 0; at < k;) {
        int64_t step = k - at < (int64_t)(MF_CKPT_IO_CHUNK / 8) ? k - at : (int64_t)(MF_CKPT_IO_CHUNK / 8);
        if (mf_ckpt_read(c->r, 0, c->tensor[entry], a + at, a + at + step, c->buf, err, errlen) != 0)
            return -1;
        mf_dtype_convert((char *)buf + (size_t)at * ds, c->dtype, c->buf, sd, step);
        at += step;
    }
    return 0;
}

/* Writes the index of a multi-file export. */
static int ck_exp_index(const char *tmp, mf_ckpt_wentry *e, const int *file_of, int n, int nfiles, uint64_t total,
                        char *err, size_t errlen)
{
    json_t *root = json_pack("{s{sI}s{}}", "metadata", "total_size", (json_int_t)total, "weight_map");
    json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
    char fn[64];
    for (int i = 0; wm && i < n; i++) {
        snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", file_of[i] + 1, nfiles);
        json_object_set_new(wm, e[i].name, json_string(fn));
    }
    char *text = wm ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return snprintf(err, errlen, "out of memory"), -1;
    int rc = mf_ckpt_write_small(tmp, "model.safetensors.index.json", text, strlen(text), err, errlen);
    free(text);
    return rc;
}

/* The entries of the export (tied tensors once), in manifest order. */
static int ck_exp_entries(const mf_ckpt_manifest *m, const mf_hf_rules *rules, mf_dtype dt, mf_ckpt_wentry *e,
                          int *tensor, int *count, char *err, size_t errlen)
{
    int n = 0;
    *count = 0;
    char name[1024];
    for (int t = 0; t < m->ntensors; t++) {
        int tied = 0;
        for (int i = 0; i < rules->ntie; i++)
            if (strcmp(rules->tie[i], m->tensors[t].name) == 0) {
                int s = mf_ckpt_manifest_tensor(m, rules->tie_src[i]);
                if (s < 0 || m->tensors[s].numel != m->tensors[t].numel)
                    return snprintf(err, errlen, "--tie %s=%s: the source is not a tensor of the same size",
                                    rules->tie[i], rules->tie_src[i]), -1;
                tied = 1;
            }
        if (tied)
            continue;
        mf_hf_to_hf(rules, m->tensors[t].name, name, sizeof name);
        mf_ckpt_wentry *w = &e[n];
        if (!(w->name = strdup(name)))
            return snprintf(err, errlen, "out of memory"), -1;
        *count = n + 1;
        w->dtype = mf_ckpt_st_dtype(dt);
        w->ndims = m->tensors[t].ndims;
        memcpy(w->shape, m->tensors[t].dims, sizeof w->shape);
        w->bytes = (uint64_t)m->tensors[t].numel * mf_dtype_size(dt);
        tensor[n++] = t;
        *count = n;
    }
    return 0;
}

int ck_export(int argc, char **argv)
{
    mf_hf_rules rules = {0};
    mf_ckpt_reader r;
    int dtype = -1, rc = 1, made = 0, opened = 0, n = 0, nfiles = 0;
    uint64_t maxb = MF_HF_MAX_FILE_BYTES, total = 0;
    char err[4096] = "", tmp[4200], id[33];
    mf_ckpt_wentry *e = NULL;
    int *tensor = NULL, *file_of = NULL;
    void *buf = NULL;
    struct stat sb;
    if (argc < 3 || ck_hf_opts(argc, argv, 3, &rules, &dtype, &maxb) != 0) {
        ck_hf_rules_free(&rules);
        return 2;
    }
    char *out = argv[2];
    out[mf_ckpt_dir_len(out)] = '\0'; /* "out/" writes "out" */
    if (mf_ckpt_reader_open(argv[1], &r, err, sizeof err) != 0)
        goto fail;
    opened = 1;
    mf_dtype dt = dtype < 0 ? r.m.states[0].dtype : (mf_dtype)dtype;
    e = calloc((size_t)r.m.ntensors + 1, sizeof *e);
    tensor = calloc((size_t)r.m.ntensors + 1, sizeof *tensor);
    file_of = calloc((size_t)r.m.ntensors + 1, sizeof *file_of);
    buf = malloc(MF_CKPT_IO_CHUNK / 2);
    if (!e || !tensor || !file_of || !buf) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    if (ck_exp_entries(&r.m, &rules, dt, e, tensor, &n, err, sizeof err) != 0)
        goto fail;
    if (stat(out, &sb) == 0 || strlen(out) > 4000) {
        snprintf(err, sizeof err, "%.4000s already exists (or its name is too long)", out);
        goto fail;
    }
    /* Files: consecutive tensors up to maxb bytes each (a larger tensor alone). */
    uint64_t in_file = 0;
    for (int i = 0; i < n; i++) {
        if (in_file > 0 && in_file + e[i].bytes > maxb) {
            nfiles++;
            in_file = 0;
        }
        file_of[i] = nfiles;
        in_file += e[i].bytes;
        total += e[i].bytes;
    }
    nfiles++;
    mf_ckpt_new_id(id);
    snprintf(tmp, sizeof tmp, "%s.tmp-%s", out, id);
    if (mkdir(tmp, 0755) != 0) {
        snprintf(err, sizeof err, "cannot create %.4000s", tmp);
        goto fail;
    }
    made = 1;
    for (int f = 0, i = 0; f < nfiles; f++) {
        int j = i;
        while (j < n && file_of[j] == f)
            j++;
        char path[8400];
        mf_ckpt_written wr;
        ck_exp c = {&r, tensor + i, dt, buf};
        if (nfiles == 1)
            snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        else
            snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", tmp, f + 1, nfiles);
        if (mf_ckpt_write_file(path, e + i, j - i, NULL, 0, ck_exp_fill, &c, &wr, err, sizeof err) != 0)
            goto fail;
        i = j;
    }
    /* Tensors are read in chunks, so pieces in part: their CRCs now. */
    if (mf_ckpt_parts_check(&r, r.parts, r.nparts, 0, err, sizeof err) != 0 ||
        (nfiles > 1 && ck_exp_index(tmp, e, file_of, n, nfiles, total, err, sizeof err) != 0) ||
        mf_ckpt_commit_dir(tmp, out, err, sizeof err) != 0)
        goto fail;
    made = 0;
    printf("exported %s -> %s: %d tensors, %d file%s, %s\n", argv[1], out, n, nfiles, nfiles > 1 ? "s + index" : "",
           mf_dtype_name(dt));
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "mfsdp-ckpt: error: %s\n", err);
done:
    if (made)
        mf_ckpt_remove_dir(tmp);
    for (int i = 0; e && i < n; i++)
        free(e[i].name);
    free(e);
    free(tensor);
    free(file_of);
    free(buf);
    if (opened)
        mf_ckpt_reader_close(&r);
    ck_hf_rules_free(&rules);
    return rc;
}
