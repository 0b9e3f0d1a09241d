/*
 * mfsdp-ckpt import / export: Hugging Face checkpoints (docs/checkpoint.md,
 * "Hugging Face"), streamed through bounded buffers. The format work (open,
 * match, read with conversion, the export's layout and writer) is the
 * runtime's own, in ckpt/mf_ckpt_hf.h and ckpt/mf_ckpt_hf_layout.h: an
 * export by this tool and one by mfsdp_ckpt_export_hf are the same bytes.
 *
 *   import HF SCHEDULE.yaml OUT [--map FROM=TO]... [--tie NAME=SOURCE]...
 *       an mfsdp checkpoint (main_weight only, step 0) for the schedule;
 *       Distinct tensors from their global names (each coordinate's own
 *       tensor, or its runs of a split one: mf_ckpt_plan_gstart)
 *   export DIR OUT [--dtype bf16|fp16|fp32] [--map FROM=TO]... [--tie NAME=SOURCE]...
 *          [--max-file-bytes N]
 *       consolidated full tensors: OUT/model.safetensors, or
 *       OUT/model-0000k-of-0000N.safetensors + model.safetensors.index.json
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_ckpt_build.h"
#include "mf_ckpt_hf.h"
#include "mf_ckpt_hf_layout.h"
#include "mf_load.h"
#include "mf_opts.h"
#include "mfsdp_ckpt_tool.h"

/* A bad option: its argument as written and the one after it (the value it
 * was given, when there is one), like "bad option --dtype fp8". No next
 * argument: no message (a usage error all the same). */
static int ck_hf_bad(const char *a, const char *v)
{
    if (v)
        fprintf(stderr, "mfsdp-ckpt: error: bad option %s %s\n", a, v);
    return -1;
}

/* Parses the options after the positional arguments argv[1..first) with
 * core's mf_opts (quiet: the messages are this tool's): --map and --tie,
 * and --dtype and --max-file-bytes where dtype and maxb are given. 0, or -1
 * (a usage error, its message on stderr). */
static int ck_hf_opts(int argc, char **argv, int first, mf_hf_rules *r, int *dtype, uint64_t *maxb)
{
    enum { O_MAP, O_TIE, O_DTYPE, O_MAX_FILE_BYTES };
    static const mf_opt table[] = {
        {"--map", NULL, "FROM=TO", O_MAP},
        {"--tie", NULL, "NAME=SOURCE", O_TIE},
        {"--dtype", NULL, "bf16|fp16|fp32", O_DTYPE},
        {"--max-file-bytes", NULL, "N", O_MAX_FILE_BYTES},
    };
    int n = argc - first + 1, id;
    char **sub = argv + first - 1; /* sub[0] stands for the subcommand */
    const char *v;
    mf_opts p;
    mf_opts_init(&p, "mfsdp-ckpt", n, sub, table, (int)(sizeof table / sizeof *table), NULL);
    p.quiet = true;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == O_MAP && mf_ckpt_hf_rule_add(r, 0, v) == 0)
            continue;
        if (id == O_TIE && mf_ckpt_hf_rule_add(r, 1, v) == 0)
            continue;
        if (id == O_DTYPE && dtype && mf_dtype_from_name(v) >= 0) {
            *dtype = mf_dtype_from_name(v);
            continue;
        }
        if (id == O_MAX_FILE_BYTES && maxb && strtoull(v, NULL, 10) > 0) {
            *maxb = strtoull(v, NULL, 10);
            continue;
        }
        if (id == MF_OPTS_NO_VALUE)
            return -1; /* the last option lacks its value */
        if (id < 0) /* unknown, or an operand too many */
            return ck_hf_bad(p.arg, p.i < n ? sub[p.i] : NULL);
        return ck_hf_bad(table[id].name, v);
    }
    return 0;
}

/* A command's end: a failure (rc != 0) reported, the temporary directory of
 * an output not committed (made) removed. Returns rc. */
static int ck_hf_end(int rc, const char *err, int made, const char *tmp)
{
    if (rc != 0)
        fprintf(stderr, "mfsdp-ckpt: error: %s\n", err);
    if (made)
        mf_ckpt_io_remove_dir(tmp);
    return rc;
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
    /* a piece is one range of its global tensor (split: of W, mf_ckpt_plan.h) */
    int64_t a = mf_ckpt_plan_gstart(&c->p->t[pc->tensor], pc->start) + (int64_t)(off / mf_dtype_size(d));
    return mf_hf_model_read(c->m, c->src[pc->tensor], a, a + (int64_t)(n / mf_dtype_size(d)), buf, d, err, errlen);
}

/* Rank r's data file in tmp, and its report. */
static int ck_imp_rank(const ck_imp *c, const mf_ckpt_states *st, const char *tmp, const char *id,
                       mf_ckpt_report *rep, char *err, size_t errlen)
{
    mf_ckpt_wentry *e = NULL;
    int n = 0, rc = 0;
    if (mf_ckpt_build_entries(c->p, c->rank, st, 0, &e, &n) != 0)
        return snprintf(err, errlen, "out of memory"), -1;
    if (n > 0) {
        char path[8400], name[48];
        mf_ckpt_written wr;
        mf_ckpt_build_file_name(c->rank, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        rc = mf_ckpt_write_file(path, e, n, id, c->rank, ck_imp_fill, (void *)c, &wr, err, errlen);
        *rep = (mf_ckpt_report){rc == 0, wr.bytes, wr.header_bytes, 0, wr.crc32c};
    }
    mf_ckpt_build_entries_free(e, n);
    return rc;
}

int ck_import(int argc, char **argv)
{
    mf_hf_rules rules = {0};
    mf_hf_model m = {0};
    mf_ckpt_plan p = {0};
    mf_schedule *s = NULL;
    char err[8192] = "", tmp[4200], id[33];
    int rc = 1, made = 0, *src = NULL;
    mf_hf_shape *shapes = NULL;
    mf_ckpt_report *rep = NULL;
    if (argc < 4 || ck_hf_opts(argc, argv, 4, &rules, NULL, NULL) != 0) {
        mf_hf_rules_free(&rules);
        return 2;
    }
    char *out = argv[3];
    out[mf_ckpt_io_dir_len(out)] = '\0'; /* "out/" writes "out" */
    if (mf_ckpt_hf_open(argv[1], &m, err, sizeof err) != 0 || !(s = mf_load_schedule_file(argv[2], err, sizeof err)) ||
        mf_ckpt_plan_build(s, &p, err, sizeof err) != 0)
        goto fail;
    src = calloc((size_t)p.ntensors + 1, sizeof *src);
    shapes = mf_ckpt_hf_shapes_of_plan(&p);
    rep = calloc((size_t)p.world, sizeof *rep);
    if (!src || !shapes || !rep) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    if (mf_ckpt_hf_match(&m, &rules, shapes, p.ntensors, src, err, sizeof err) != 0 ||
        mf_ckpt_build_begin_dir(out, id, tmp, sizeof tmp, err, sizeof err) != 0)
        goto fail;
    made = 1;
    mf_ckpt_states st = {.n = 1, .name = {"main_weight"}, .dtype = {p.ntensors ? p.t[0].dtype : MF_FP32}};
    for (int64_t r = 0; r < p.world; r++) {
        ck_imp c = {&m, &p, src, r};
        if (ck_imp_rank(&c, &st, tmp, id, &rep[r], err, sizeof err) != 0)
            goto fail;
    }
    if (mf_ckpt_build_finish_dir(s, &p, &st, id, 0, rep, tmp, out, err, sizeof err) != 0)
        goto fail;
    made = 0;
    printf("imported %s -> %s: %d tensors for %" PRId64 " ranks\n", argv[1], out, p.ntensors, p.world);
    rc = 0;
fail:
    ck_hf_end(rc, err, made, tmp);
    free(rep);
    free(src);
    free(shapes);
    mf_ckpt_plan_free(&p);
    mf_schedule_free(s);
    mf_ckpt_hf_close(&m);
    mf_hf_rules_free(&rules);
    return rc;
}

/* ---- export ---- */

/* A tie whose NAME is a tensor of the checkpoint needs a SOURCE of its size. */
static int ck_exp_ties(const mf_ckpt_manifest *m, const mf_hf_rules *rules, char *err, size_t errlen)
{
    for (int t = 0; t < m->ntensors; t++)
        for (int i = 0; i < rules->ntie; i++)
            if (strcmp(rules->tie[i], m->tensors[t].name) == 0) {
                int s = mf_ckpt_manifest_tensor(m, rules->tie_src[i]);
                if (s < 0 || m->tensors[s].numel != m->tensors[t].numel)
                    return snprintf(err, errlen, "--tie %s=%s: the source is not a tensor of the same size",
                                    rules->tie[i], rules->tie_src[i]), -1;
            }
    return 0;
}

/* Every stored tensor of the layout, read from main_weight a bounded chunk
 * at a time (so pieces in part: the caller checks their CRCs after), into
 * the files made in tmp. */
static int ck_exp_write(mf_ckpt_reader *r, const mf_hf_layout *l, const char *tmp, char *err, size_t errlen)
{
    const int64_t per = (int64_t)(MF_CKPT_IO_CHUNK / 8); /* elements; fp32 at most: 8 MiB */
    mf_dtype sd = r->m.states[0].dtype;
    void *buf = malloc((size_t)per * sizeof(float));
    mf_hf_writer w;
    if (!buf || mf_hf_writer_open(&w, l, tmp, err, errlen) != 0) {
        free(buf);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    int rc = 0;
    for (int t = 0; rc == 0 && t < l->ntensors; t++) {
        int64_t numel = l->file[t] < 0 ? 0 : r->m.tensors[t].numel;
        for (int64_t a = 0; rc == 0 && a < numel; a += per) {
            int64_t k = numel - a < per ? numel - a : per;
            if (mf_ckpt_read(r, 0, t, a, a + k, buf, err, errlen) != 0 ||
                mf_hf_writer_put(&w, t, a, buf, sd, k, err, errlen) != 0)
                rc = -1;
        }
    }
    if (mf_hf_writer_close(&w, rc == 0, err, errlen) != 0)
        rc = -1;
    free(buf);
    return rc;
}

int ck_export(int argc, char **argv)
{
    mf_hf_rules rules = {0};
    mf_hf_layout l = {0};
    mf_hf_shape *shapes = NULL;
    mf_ckpt_reader r;
    int dtype = -1, rc = 1, made = 0, opened = 0, stored = 0;
    uint64_t maxb = MF_HF_MAX_FILE_BYTES;
    char err[4096] = "", tmp[4200], id[33];
    struct stat sb;
    if (argc < 3 || ck_hf_opts(argc, argv, 3, &rules, &dtype, &maxb) != 0) {
        mf_hf_rules_free(&rules);
        return 2;
    }
    char *out = argv[2];
    out[mf_ckpt_io_dir_len(out)] = '\0'; /* "out/" writes "out" */
    if (mf_ckpt_read_open(argv[1], &r, err, sizeof err) != 0)
        goto fail;
    opened = 1;
    mf_dtype dt = dtype < 0 ? r.m.states[0].dtype : (mf_dtype)dtype;
    if (ck_exp_ties(&r.m, &rules, err, sizeof err) != 0)
        goto fail;
    if (stat(out, &sb) == 0 || strlen(out) > 4000) {
        snprintf(err, sizeof err, "%.4000s already exists (or its name is too long)", out);
        goto fail;
    }
    if (!(shapes = mf_ckpt_hf_shapes_of_manifest(&r.m)) ||
        mf_hf_layout_build(shapes, r.m.ntensors, &rules, dt, maxb, &l) != 0) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    for (int t = 0; t < l.ntensors; t++)
        stored += l.file[t] >= 0;
    mf_ckpt_build_new_id(id);
    snprintf(tmp, sizeof tmp, "%s.tmp-%s", out, id);
    if (mkdir(tmp, 0755) != 0) {
        snprintf(err, sizeof err, "cannot create %.4000s", tmp);
        goto fail;
    }
    made = 1;
    /* Tensors are read in chunks, so pieces in part: their CRCs before the commit. */
    if (mf_hf_layout_create(&l, tmp, err, sizeof err) != 0 || ck_exp_write(&r, &l, tmp, err, sizeof err) != 0 ||
        mf_ckpt_parts_check(&r, r.parts, r.nparts, 0, err, sizeof err) != 0 ||
        mf_ckpt_write_commit_dir(tmp, out, err, sizeof err) != 0)
        goto fail;
    made = 0;
    printf("exported %s -> %s: %d tensors, %d file%s, %s\n", argv[1], out, stored, l.nfiles,
           l.nfiles > 1 ? "s + index" : "", mf_dtype_name(dt));
    rc = 0;
fail:
    ck_hf_end(rc, err, made, tmp);
    mf_hf_layout_free(&l);
    free(shapes);
    if (opened)
        mf_ckpt_read_close(&r);
    mf_hf_rules_free(&rules);
    return rc;
}
