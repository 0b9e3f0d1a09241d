/*
 * mfsdp-ckpt: the offline checkpoint tool (docs/checkpoint.md). One process,
 * streaming through a bounded buffer (MF_CKPT_IO_CHUNK), never holding a
 * whole tensor:
 *
 *   mfsdp-ckpt info DIR                  what a checkpoint holds
 *   mfsdp-ckpt verify DIR                every checksum and range (exit 0/1)
 *   mfsdp-ckpt reshard DIR NEW.yaml OUT  the same state for another schedule
 *   mfsdp-ckpt import HF NEW.yaml OUT    from Hugging Face (mfsdp_ckpt_hf.c)
 *   mfsdp-ckpt export DIR OUT_HF         to Hugging Face (mfsdp_ckpt_hf.c)
 *
 * Exit status: 0 success, 1 a refused checkpoint or input, 2 usage errors.
 * An output directory is committed like a save (temporary directory, fsync,
 * rename): on failure nothing is left behind, a file-size limit included
 * (SIGXFSZ is ignored: the write fails with "file too large").
 */
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_ckpt_build.h"
#include "mf_load.h"
#include "mf_opts.h"
#include "mfsdp_ckpt_tool.h"

static int ck_usage(FILE *out)
{
    fprintf(out, "usage: mfsdp-ckpt COMMAND ARGS\n\n"
                 "  info DIR                         format, mesh, states, tensors, files, user blobs\n"
                 "  verify DIR                       check every file's and piece's CRC-32C (exit 0/1)\n"
                 "  reshard DIR SCHEDULE.yaml OUT    write the checkpoint for another schedule\n"
                 "  import HF SCHEDULE.yaml OUT [--map FROM=TO]... [--tie NAME=SOURCE]...\n"
                 "                                   main_weight from a Hugging Face model.safetensors,\n"
                 "                                   its .index.json, or a directory with either\n"
                 "  export DIR OUT [--dtype bf16|fp16|fp32] [--map FROM=TO]... [--tie NAME=SOURCE]...\n"
                 "             [--max-file-bytes N]  consolidated Hugging Face files (+ index)\n"
                 "\n"
                 "exit status: 0 success, 1 refused input, 2 usage error\n");
    return out == stdout ? 0 : 2;
}

/* Opens the checkpoint in dir; false after "mfsdp-ckpt: error: ...". */
static bool ck_open(const char *dir, mf_ckpt_reader *r)
{
    char err[2048];
    if (mf_ckpt_read_open(dir, r, err, sizeof err) == 0)
        return true;
    fprintf(stderr, "mfsdp-ckpt: error: %s\n", err);
    return false;
}

static int ck_info(const char *dir)
{
    mf_ckpt_reader r;
    if (!ck_open(dir, &r))
        return 1;
    const mf_ckpt_manifest *m = &r.m;
    printf("checkpoint %s\nformat: %s version %d\nid: %s\nstep: %" PRId64 "\nmesh:", dir, MF_CKPT_FORMAT, m->version,
           m->id, m->step);
    for (int a = 0; a < m->naxes; a++)
        printf("%s %s=%" PRId64, a ? " x" : "", m->axis_name[a], m->axis_size[a]);
    printf(" (%" PRId64 " ranks)\nschedule sha256: %s\nstates:", m->world, m->schedule_sha256);
    for (int s = 0; s < m->nstates; s++)
        printf("%s %s (%s)", s ? "," : "", m->states[s].name, mf_dtype_name(m->states[s].dtype));
    int64_t elems = 0;
    for (int t = 0; t < m->ntensors; t++)
        elems += m->tensors[t].numel;
    uint64_t bytes = 0, data = 0, blobs = 0;
    int nblobs = 0;
    for (int f = 0; f < m->nfiles; f++) {
        bytes += m->files[f].bytes;
        blobs += m->files[f].blob_bytes;
        nblobs += m->files[f].blob_bytes > 0;
    }
    for (int64_t i = 0; i < m->npieces; i++)
        data += (uint64_t)(m->pieces[i].end - m->pieces[i].start) * mf_dtype_size(m->states[m->pieces[i].state].dtype);
    printf("\ntensors: %d (%" PRId64 " elements)\nfiles: %d, %" PRIu64 " bytes (tensor data %" PRIu64
           ", user blobs %" PRIu64 ", headers %" PRIu64 ")\npieces: %" PRId64 "\nuser blobs: %d ranks, %" PRIu64
           " bytes\n", m->ntensors, elems, m->nfiles, bytes, data, blobs, bytes - data - blobs, m->npieces, nblobs,
           blobs);
    for (int t = 0; t < m->ntensors; t++) {
        printf("  %s [", m->tensors[t].name);
        for (int d = 0; d < m->tensors[t].ndims; d++)
            printf("%s%" PRId64, d ? ", " : "", m->tensors[t].dims[d]);
        printf("] %" PRId64 " elements\n", m->tensors[t].numel);
    }
    mf_ckpt_read_close(&r);
    return 0;
}

static int ck_verify(const char *dir)
{
    mf_ckpt_reader r;
    char err[2048];
    if (!ck_open(dir, &r))
        return 1;
    int rc = 0;
    for (int f = 0; f < r.m.nfiles && rc == 0; f++)
        if (mf_ckpt_read_verify_file(&r, f, err, sizeof err) != 0) {
            fprintf(stderr, "mfsdp-ckpt: error: %s\n", err);
            rc = 1;
        }
    if (rc == 0)
        printf("ok: %s: %d files, %" PRIu64 " bytes, every CRC-32C and range checked\n", dir, r.m.nfiles,
               r.bytes_read);
    mf_ckpt_read_close(&r);
    return rc;
}

/* ---- reshard ---- */

typedef struct ck_fill {
    mf_ckpt_reader *r;
    const mf_ckpt_plan *p;
    const int *tmap;        /* plan tensor -> manifest tensor */
    int64_t rank, np;
    const void *blob;
} ck_fill;

static int ck_fill_fn(void *ctx, int entry, uint64_t off, void *buf, size_t n, char *err, size_t errlen)
{
    ck_fill *c = ctx;
    if (entry >= c->np * c->r->m.nstates) {
        memcpy(buf, (const char *)c->blob + off, n);
        return 0;
    }
    int s = (int)(entry / c->np);
    const mf_ckpt_piece *pc = &c->p->p[c->p->first[c->rank] + entry % c->np];
    size_t es = mf_dtype_size(c->r->m.states[s].dtype);
    /* A piece is one contiguous range of its checkpoint tensor (a split
     * global tensor's pieces never cross a run: mf_ckpt_plan.h). */
    int64_t a = mf_ckpt_plan_gstart(&c->p->t[pc->tensor], pc->start) + (int64_t)(off / es);
    return mf_ckpt_read(c->r, s, c->tmap[pc->tensor], a, a + (int64_t)(n / es), buf, err, errlen);
}

/* Plan tensors must be the checkpoint's: same names, shapes (a split global
 * tensor's: the global W's, with the same sizes of its Distinct axes), dtype. */
static int ck_match(const mf_ckpt_manifest *m, const mf_schedule *s, const mf_ckpt_plan *p, int *tmap, char *err,
                    size_t errlen)
{
    if (p->nmt != m->ntensors)
        return snprintf(err, errlen, "the schedule has %d tensors, the checkpoint %d", p->nmt, m->ntensors), -1;
    if (mf_ckpt_plan_check_split(s, m->naxes, m->axis_name, m->axis_size, err, errlen) != 0)
        return -1;
    for (int k = 0; k < p->ntensors; k++) {
        int t = tmap[k] = mf_ckpt_manifest_tensor(m, p->t[k].name);
        if (t < 0)
            return snprintf(err, errlen, "tensor '%s' is not in the checkpoint", p->t[k].name), -1;
        if (m->tensors[t].ndims != p->t[k].ndims ||
            memcmp(m->tensors[t].dims, p->t[k].gdims, sizeof(int64_t) * (size_t)p->t[k].ndims) != 0)
            return snprintf(err, errlen, "tensor '%s' has another shape in the checkpoint", p->t[k].name), -1;
        if (p->t[k].dtype != m->states[0].dtype)
            return snprintf(err, errlen, "tensor '%s': main_weight is %s in the checkpoint, %s in the schedule",
                            p->t[k].name, mf_dtype_name(m->states[0].dtype), mf_dtype_name(p->t[k].dtype)), -1;
    }
    return 0;
}

/* Writes rank r's file of the new checkpoint. */
static int ck_reshard_rank(mf_ckpt_reader *r, const mf_ckpt_plan *p, const int *tmap, const mf_ckpt_states *st,
                           const char *tmp, const char *id, int64_t rank, mf_ckpt_report *rep, char *err,
                           size_t errlen)
{
    size_t blen = 0;
    void *blob = NULL;
    if (mf_ckpt_read_blob(r, rank, NULL, 0, &blen, err, errlen) != 0)
        return -1;
    if (blen && (!(blob = malloc(blen)) || mf_ckpt_read_blob(r, rank, blob, blen, &blen, err, errlen) != 0)) {
        free(blob);
        return snprintf(err, errlen, "cannot read the user blob of rank %" PRId64, rank), -1;
    }
    mf_ckpt_wentry *e = NULL;
    int n = 0, rc = 0;
    if (mf_ckpt_build_entries(p, rank, st, blen, &e, &n) != 0) {
        free(blob);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    if (n > 0) {
        char path[4200], name[48];
        mf_ckpt_written wr;
        ck_fill c = {r, p, tmap, rank, p->first[rank + 1] - p->first[rank], blob};
        mf_ckpt_build_file_name(rank, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        rc = mf_ckpt_write_file(path, e, n, id, rank, ck_fill_fn, &c, &wr, err, errlen);
        *rep = (mf_ckpt_report){rc == 0, wr.bytes, wr.header_bytes, blen, wr.crc32c};
    }
    mf_ckpt_build_entries_free(e, n);
    free(blob);
    return rc;
}

static int ck_reshard(const char *dir, const char *sched, char *out)
{
    out[mf_ckpt_io_dir_len(out)] = '\0'; /* "out/" writes "out" */
    mf_ckpt_reader r;
    mf_ckpt_plan p = {0};
    mf_schedule *s = NULL;
    char err[2048], id[33], tmp[4096];
    int rc = 1, *tmap = NULL, made = 0;
    mf_ckpt_report *rep = NULL;
    if (mf_ckpt_read_open(dir, &r, err, sizeof err) != 0) {
        fprintf(stderr, "mfsdp-ckpt: error: %s\n", err);
        return 1;
    }
    for (int f = 0; f < r.m.nfiles; f++)
        if (mf_ckpt_read_verify_file(&r, f, err, sizeof err) != 0)
            goto fail;
    if (!(s = mf_load_schedule_file(sched, err, sizeof err)) || mf_ckpt_plan_build(s, &p, err, sizeof err) != 0)
        goto fail;
    tmap = calloc((size_t)p.ntensors + 1, sizeof *tmap);
    rep = calloc((size_t)p.world, sizeof *rep);
    if (!tmap || !rep || ck_match(&r.m, s, &p, tmap, err, sizeof err) != 0)
        goto fail;
    if (mf_ckpt_build_begin_dir(out, id, tmp, sizeof tmp, err, sizeof err) != 0)
        goto fail;
    made = 1;
    mf_ckpt_states st = {.n = r.m.nstates};
    for (int i = 0; i < st.n; i++) {
        st.name[i] = r.m.states[i].name;
        st.dtype[i] = r.m.states[i].dtype;
    }
    for (int64_t k = 0; k < p.world; k++)
        if (ck_reshard_rank(&r, &p, tmap, &st, tmp, id, k, &rep[k], err, sizeof err) != 0)
            goto fail;
    if (mf_ckpt_build_finish_dir(s, &p, &st, id, r.m.step, rep, tmp, out, err, sizeof err) != 0)
        goto fail;
    made = 0;
    printf("resharded %s -> %s: %" PRId64 " ranks, %" PRIu64 " bytes read\n", dir, out, p.world, r.bytes_read);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "mfsdp-ckpt: error: %s\n", err);
done:
    if (made)
        mf_ckpt_io_remove_dir(tmp);
    free(rep);
    free(tmap);
    mf_ckpt_plan_free(&p);
    mf_schedule_free(s);
    mf_ckpt_read_close(&r);
    return rc;
}

/* Exactly n operands after the command (argv[0]) into pos[], no option
 * among them. */
static bool ck_operands(int argc, char **argv, int n, char **pos)
{
    mf_opts p;
    mf_opts_init(&p, "mfsdp-ckpt", argc, argv, NULL, 0, NULL);
    p.quiet = true; /* "wrong arguments", by main */
    int id, k = 0;
    const char *v;
    while ((id = mf_opts_next(&p, &v)) == MF_OPTS_OPERAND && k < n)
        pos[k++] = p.argv[p.i - 1]; /* v, writable: reshard trims OUT's slash */
    return id == MF_OPTS_END && k == n;
}

int main(int argc, char **argv)
{
    /* A file-size limit (ulimit -f) fails the write with EFBIG ("file too
     * large"), which the writers report and clean up after, instead of
     * killing the tool with its temporaries left behind (like mfsdpc). */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2)
        return ck_usage(stderr);
    const char *cmd = argv[1];
    char *pos[3];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))
        return ck_usage(stdout);
    if (!strcmp(cmd, "info") && ck_operands(argc - 1, argv + 1, 1, pos))
        return ck_info(pos[0]);
    if (!strcmp(cmd, "verify") && ck_operands(argc - 1, argv + 1, 1, pos))
        return ck_verify(pos[0]);
    if (!strcmp(cmd, "reshard") && ck_operands(argc - 1, argv + 1, 3, pos))
        return ck_reshard(pos[0], pos[1], pos[2]);
    if (!strcmp(cmd, "import")) {
        int rc = ck_import(argc - 1, argv + 1);
        return rc == 2 ? ck_usage(stderr) : rc;
    }
    if (!strcmp(cmd, "export")) {
        int rc = ck_export(argc - 1, argv + 1);
        return rc == 2 ? ck_usage(stderr) : rc;
    }
    fprintf(stderr, "mfsdp-ckpt: error: unknown command or wrong arguments: %s\n", cmd);
    return ck_usage(stderr);
}
