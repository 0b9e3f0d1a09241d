/*
 * mf_pipeline: the driver. Reads a spec, runs parse -> sema -> layout ->
 * transitions -> lower -> verify up to the requested stage, and stops at the
 * first pass that reported errors. Also owns the two file helpers every
 * command shares: whole-file reads and atomic writes.
 */
#include "mf_pipeline.h"

#include "mf_assign.h"
#include "mf_programs.h"

#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *mf_pipeline_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || S_ISDIR(st.st_mode)) {
        fclose(f);
        errno = S_ISDIR(st.st_mode) ? EISDIR : errno;
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                errno = ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                free(buf);
                buf = NULL;
                errno = EIO;
            }
            break;
        }
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = n;
    }
    return buf;
}

static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int mf_pipeline_write_file_atomic(const char *path, const char *protect,
                                  int (*write)(FILE *out, const void *ctx), const void *ctx)
{
    if (protect && same_file(path, protect)) {
        fprintf(stderr, "mfsdpc: error: refusing to overwrite the input file '%s'\n", path);
        return -1;
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        fprintf(stderr, "mfsdpc: error: out of memory\n");
        return -1;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        fprintf(stderr, "mfsdpc: error: cannot create a temporary file next to '%s': %s\n", path,
                strerror(errno));
        free(tmp);
        return -1;
    }
    FILE *out = fdopen(fd, "wb");
    if (!out) {
        close(fd);
        unlink(tmp);
        free(tmp);
        fprintf(stderr, "mfsdpc: error: cannot write '%s': %s\n", path, strerror(errno));
        return -1;
    }
    int rc = write(out, ctx);
    if (fflush(out) != 0 || ferror(out) || fsync(fileno(out)) != 0)
        rc = -1;
    int saved = errno;
    if (fclose(out) != 0)
        rc = -1;
    if (rc == 0) {
        /* Keep the usual permissions of a new file (mkstemp makes it 0600). */
        mode_t mask = umask(0);
        umask(mask);
        chmod(tmp, 0666 & ~mask);
        if (rename(tmp, path) != 0) {
            saved = errno;
            rc = -1;
        }
    }
    if (rc != 0) {
        unlink(tmp);
        fprintf(stderr, "mfsdpc: error: cannot write '%s': %s\n", path, strerror(saved ? saved : EIO));
    }
    free(tmp);
    return rc;
}

/* Units with `layout auto` have no layout yet (docs/plan.md): every stage
 * after sema refuses them, once per unit declaration. True when refused. */
static bool refuse_auto(const mf_spec *sp, mf_diag *d)
{
    for (int u = 0; u < sp->nunits; u++) {
        const mf_spec_unit *su = &sp->units[u];
        if (!su->layout_auto || (u > 0 && sp->units[u - 1].layout_auto &&
                                 sp->units[u - 1].span.line == su->span.line &&
                                 sp->units[u - 1].span.col == su->span.col))
            continue;
        mf_diag_error(d, su->layout_span,
                      "unit \"%s\" has layout auto, which only 'mfsdpc plan' resolves; run 'mfsdpc plan %s "
                      "--memory SIZE -o PLANNED.mfsdp' and compile its output",
                      su->name, sp->path ? sp->path : "SPEC");
    }
    return mf_diag_errors(d) > 0;
}

static int run_passes(const mf_compile_options *opt, mf_compilation *c)
{
    mf_diag *d = &c->diag;
    c->ast = mf_parse(&c->src, d, c->arena);
    if (mf_diag_errors(d) || !c->ast || opt->stop_after == MF_STAGE_PARSE)
        return mf_diag_errors(d) || !c->ast ? 1 : 0;

    c->spec = mf_sema_run(c->ast, d, c->arena);
    if (mf_diag_errors(d) || !c->spec || opt->stop_after == MF_STAGE_SEMA)
        return mf_diag_errors(d) || !c->spec ? 1 : 0;
    if (refuse_auto(c->spec, d))
        return 1;

    mf_cost_model cost;
    if (opt->cost)
        cost = *opt->cost;
    else
        mf_cost_defaults(&cost, &c->spec->mesh);
    for (int i = 0; i < opt->ncost_args; i++)
        if (mf_cost_parse_option(&cost, &c->spec->mesh, opt->cost_args[i]) != 1)
            return 2;

    c->plan = mf_plan_new(c->spec, &cost);
    if (!c->plan) {
        fprintf(stderr, "mfsdpc: error: out of memory\n");
        return 2;
    }
    if (!mf_layout_pass_run(c->plan, d) || opt->stop_after == MF_STAGE_LAYOUT)
        return mf_diag_errors(d) ? 1 : 0;
    if (!mf_transition_run(c->plan, d) || opt->stop_after == MF_STAGE_TRANSITIONS)
        return mf_diag_errors(d) ? 1 : 0;
    if (!mf_lower_run(c->plan, d))
        return mf_diag_errors(d) ? 1 : 0;
    /* Buffer assignment: offsets in one arena and the waits reuse needs. */
    if (!mf_assign_run(c->plan->sched, NULL)) {
        fprintf(stderr, "mfsdpc: error: out of memory (buffer assignment)\n");
        return 2;
    }
    /* The short-step and evaluation programs, on the assigned buffers. */
    if (!mf_programs_run(c->plan->sched)) {
        fprintf(stderr, "mfsdpc: error: out of memory (short-step and evaluation programs)\n");
        return 2;
    }
    if (opt->stop_after == MF_STAGE_LOWER)
        return 0;
    if (opt->verify && mf_verify_run(c->plan->sched, d) != 0)
        return 1;
    return 0;
}

int mf_pipeline_compile_buffer(const char *path, const char *text, size_t len,
                               const mf_compile_options *opt, mf_compilation *c)
{
    memset(c, 0, sizeof *c);
    c->arena = mf_arena_create();
    if (!c->arena) {
        fprintf(stderr, "mfsdpc: error: out of memory\n");
        return 2;
    }
    c->src.path = path;
    c->src.text = text;
    c->src.len = len;
    mf_diag_init(&c->diag, &c->src, opt->diag_out);
    int rc = run_passes(opt, c);
    mf_diag_finish(&c->diag);
    return rc;
}

int mf_pipeline_compile_file(const char *path, const mf_compile_options *opt, mf_compilation *c)
{
    size_t len = 0;
    char *text = mf_pipeline_read_file(path, &len);
    if (!text) {
        memset(c, 0, sizeof *c);
        fprintf(opt->diag_out ? opt->diag_out : stderr, "mfsdpc: error: cannot read '%s': %s\n",
                path, strerror(errno));
        return 2;
    }
    int rc = mf_pipeline_compile_buffer(path, text, len, opt, c);
    c->text = text;
    return rc;
}

void mf_compilation_free(mf_compilation *c)
{
    if (!c)
        return;
    mf_plan_free(c->plan);
    mf_arena_destroy(c->arena);
    free(c->text);
    memset(c, 0, sizeof *c);
}
