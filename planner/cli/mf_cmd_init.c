/*
 * mfsdpc init MODEL --mesh AXIS=N[,AXIS=N...] --layout MODE [--unit PATTERN]... [-o FILE]
 *
 * A readable spec (.mfsdp) for the tensors of a Hugging Face checkpoint
 * (model.safetensors, model.safetensors.index.json, or a directory with
 * either; docs/checkpoint.md, "mfsdpc init"):
 *   - the mesh as given, outermost axis first;
 *   - one layout named after MODE (ddp, zero1, zero2, zero3, hsdp,
 *     hsdp_nosync, hfsdp, fsdp2d): weight in the checkpoint's dtype, grad
 *     and main_weight fp32, the mode's placements (the 2-axis modes need at
 *     least two axes; outer axes take the outer placement);
 *   - --unit 'model.layers.{i}.': tensors named PREFIX + i + '.' + REST form
 *     unit "model.layers.{i}" per i; when every block holds the same tensors
 *     (names and shapes, in order) they are written as one loop
 *     `unit "model.layers.{i}" for i in 0..N`, else one unit per block;
 *   - every other tensor belongs to the unit named by its name up to the
 *     last '.' (a name without one, such as timm's cls_token, to unit
 *     "root"), units in the order their first tensor appears in the
 *     checkpoint (file, then offset); a pattern's blocks stand together, by
 *     index, where its first block appeared. Safetensors files are usually
 *     sorted by name, not in forward order: reorder the units if it matters
 *     (unit order is the schedule's prefetch order, not a correctness issue);
 *   - tied tensors (mf_init_ties.h) are listed once, under their input
 *     side's name, with the layout `tied`: MODE's placements but the weight
 *     replicated on every axis, valid for the whole step.
 * Output: -o FILE (written whole, or not at all) or standard output.
 * Exit status: 0, 1 when the checkpoint cannot be described, 2 usage errors.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mf_ckpt_hf.h"
#include "mf_cli.h"
#include "mf_init_ties.h"
#include "mf_int.h"
#include "mf_opts.h"

#define MF_INIT_MAX_PATTERNS 16
#define MF_INIT_ROOT "root" /* the unit of tensors whose name has no '.' */

typedef struct mf_init_mode {
    const char *name;
    int two_axes;          /* needs >= 2 axes */
    char w[2], g[2], m[2]; /* placement letters: outer, inner */
} mf_init_mode;

static const mf_init_mode mf_init_modes[] = {
    {"ddp", 0, "RR", "PP", "RR"},    {"zero1", 0, "RR", "PP", "FF"},       {"zero2", 0, "RR", "FF", "FF"},
    {"zero3", 0, "FF", "FF", "FF"},  {"hsdp", 1, "RF", "PF", "RF"},        {"hsdp_nosync", 1, "RF", "PP", "RF"},
    {"hfsdp", 1, "RF", "PF", "FF"},  {"fsdp2d", 1, "FF", "FF", "FF"},
};

/* One unit of the output: a block of a pattern (pattern >= 0, index i) or a
 * plain unit; tensors are model indices. */
typedef struct mf_init_unit {
    char *name;
    int pattern;
    long index;
    int n, cap;
    int *t;
} mf_init_unit;

typedef struct mf_init {
    const mf_hf_model *m;
    mf_init_ties ties;
    int npat;
    const char *pat[MF_INIT_MAX_PATTERNS]; /* "model.layers.{i}." */
    int nunits;
    mf_init_unit *u;
} mf_init;

#define MF_INIT_NMODES (sizeof mf_init_modes / sizeof mf_init_modes[0])

static void mf_init_mode_list(FILE *out)
{
    for (size_t k = 0; k < MF_INIT_NMODES; k++)
        fprintf(out, "%s%s", k ? ", " : "", mf_init_modes[k].name);
}

static void mf_init_usage(FILE *out)
{
    fprintf(out, "usage: mfsdpc init MODEL --mesh AXIS=N[,AXIS=N...] --layout MODE [--unit PATTERN]... [-o FILE]\n\n"
                 "A spec for the tensors of a Hugging Face checkpoint (model.safetensors, its .index.json,\n"
                 "or a directory with either). MODE: ");
    mf_init_mode_list(out);
    fprintf(out, ".\nPATTERN: a name prefix with {i}, e.g. 'model.layers.{i}.' (repeated blocks).\n"
                 "exit status: 0 ok, 1 the checkpoint cannot be described, 2 usage error\n");
}

/* The name the spec gives model tensor k (a tie's may differ from the stored one). */
static const char *mf_init_name(const mf_init *in, int k)
{
    return in->ties.name[k] ? in->ties.name[k] : in->m->t[k].name;
}

/* Whether a tensor name has no UNIT.TENSOR split (no '.' inside it): it goes to unit "root". */
static int mf_init_rootless(const char *name)
{
    const char *dot = strrchr(name, '.');
    return !dot || dot == name || !dot[1];
}

/* Writes s[0..len) as the inside of a spec string (\" and \\ escaped). */
static void mf_init_put(FILE *out, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '"' || s[i] == '\\')
            fputc('\\', out);
        fputc(s[i], out);
    }
}

/* Matches name against "PRE{i}POST" (POST usually "."): *i and the rest. */
static const char *mf_init_match(const char *pat, const char *name, long *i)
{
    const char *brace = strstr(pat, "{i}");
    size_t pre = (size_t)(brace - pat);
    if (strncmp(name, pat, pre) != 0)
        return NULL;
    const char *p = name + pre;
    char *end;
    if (*p < '0' || *p > '9')
        return NULL;
    *i = strtol(p, &end, 10);
    const char *post = brace + 3;
    if (strncmp(end, post, strlen(post)) != 0 || (p[0] == '0' && end - p > 1))
        return NULL;
    return end + strlen(post);
}

static mf_init_unit *mf_init_unit_get(mf_init *in, const char *name, int pattern, long index)
{
    for (int k = 0; k < in->nunits; k++)
        if (strcmp(in->u[k].name, name) == 0)
            return &in->u[k];
    mf_init_unit *nu = realloc(in->u, (size_t)(in->nunits + 1) * sizeof *nu);
    if (!nu)
        return NULL;
    in->u = nu;
    mf_init_unit *u = &in->u[in->nunits];
    *u = (mf_init_unit){.name = strdup(name), .pattern = pattern, .index = index};
    if (!u->name)
        return NULL;
    in->nunits++;
    return u;
}

/* Model tensors in checkpoint order (file, offset). */
static int mf_init_order_cmp(const void *a, const void *b, void *ctx)
{
    const mf_hf_model *m = ctx;
    const mf_hf_tensor *x = &m->t[*(const int *)a], *y = &m->t[*(const int *)b];
    int c = mf_cmp_i64(x->file, y->file);
    return c ? c : mf_cmp_i64((int64_t)x->offset, (int64_t)y->offset);
}

/* Units in output order: a pattern's blocks together, by index, where its
 * first block appeared; the others where they appeared. */
static int mf_init_unit_cmp(const void *a, const void *b, void *ctx)
{
    const int *first = ctx; /* per pattern: position of its first unit */
    const mf_init_unit *x = a, *y = b;
    long kx = x->pattern >= 0 ? first[x->pattern] : x->index, ky = y->pattern >= 0 ? first[y->pattern] : y->index;
    if (kx != ky)
        return kx < ky ? -1 : 1;
    if (x->pattern != y->pattern)
        return x->pattern < y->pattern ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static void mf_init_sort(mf_init *in)
{
    int first[MF_INIT_MAX_PATTERNS];
    for (int p = 0; p < MF_INIT_MAX_PATTERNS; p++)
        first[p] = -1;
    for (int k = 0; k < in->nunits; k++) {
        mf_init_unit *u = &in->u[k];
        if (u->pattern >= 0 && first[u->pattern] < 0)
            first[u->pattern] = k;
        if (u->pattern < 0)
            u->index = k; /* plain units sort by position */
    }
    qsort_r(in->u, (size_t)in->nunits, sizeof *in->u, mf_init_unit_cmp, first);
}

static int mf_init_group(mf_init *in)
{
    const mf_hf_model *m = in->m;
    int *ord = malloc((size_t)(m->n + 1) * sizeof *ord), rc = 1;
    if (!ord)
        return fprintf(stderr, "mfsdpc: error: out of memory\n"), 1;
    for (int k = 0; k < m->n; k++)
        ord[k] = k;
    qsort_r(ord, (size_t)m->n, sizeof *ord, mf_init_order_cmp, (void *)m);
    for (int j = 0; j < m->n; j++) {
        if (in->ties.dropped[ord[j]])
            continue;
        const char *name = mf_init_name(in, ord[j]), *dot = strrchr(name, '.');
        char unit[1024];
        for (const char *c = name; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == '{' || *c == '}') {
                fprintf(stderr, "mfsdpc: error: tensor '%s' has a %s, which a spec name cannot hold\n", name,
                        *c == '{' || *c == '}' ? "brace ({var} substitutes a loop variable)" : "control character");
                goto done;
            }
        int pattern = -1;
        long idx = 0;
        for (int p = 0; p < in->npat && pattern < 0; p++)
            if (mf_init_match(in->pat[p], name, &idx)) {
                pattern = p;
                const char *brace = strstr(in->pat[p], "{i}");
                snprintf(unit, sizeof unit, "%.*s%ld", (int)(brace - in->pat[p]), in->pat[p], idx);
            }
        if (pattern < 0 && mf_init_rootless(name))
            snprintf(unit, sizeof unit, "%s", MF_INIT_ROOT);
        else if (pattern < 0)
            snprintf(unit, sizeof unit, "%.*s", (int)(dot - name), name);
        mf_init_unit *u = mf_init_unit_get(in, unit, pattern, idx);
        if (!u || (u->n == u->cap && !(u->t = realloc(u->t, (size_t)(u->cap = u->cap ? 2 * u->cap : 8) * sizeof *u->t)))) {
            fprintf(stderr, "mfsdpc: error: out of memory\n");
            goto done;
        }
        u->t[u->n++] = ord[j];
    }
    mf_init_sort(in);
    rc = 0;
done:
    free(ord);
    return rc;
}

/* The name of tensor k within unit u (the whole name in the root unit). */
static const char *mf_init_tensor_name(const mf_init *in, const mf_init_unit *u, int k)
{
    const char *name = mf_init_name(in, u->t[k]);
    size_t n = strlen(u->name);
    return strncmp(name, u->name, n) == 0 && name[n] == '.' ? name + n + 1 : name;
}

/* Same tensors (names within the unit, tied or not, shapes, in order) in two blocks. */
static int mf_init_same(const mf_init *in, const mf_init_unit *a, const mf_init_unit *b)
{
    if (a->n != b->n)
        return 0;
    for (int k = 0; k < a->n; k++) {
        const mf_hf_tensor *x = &in->m->t[a->t[k]], *y = &in->m->t[b->t[k]];
        if (strcmp(mf_init_tensor_name(in, a, k), mf_init_tensor_name(in, b, k)) != 0 || x->ndims != y->ndims ||
            memcmp(x->dims, y->dims, sizeof(int64_t) * (size_t)x->ndims) != 0 ||
            in->ties.tied[a->t[k]] != in->ties.tied[b->t[k]])
            return 0;
    }
    return 1;
}

static void mf_init_unit_body(FILE *out, const mf_init *in, const mf_init_unit *u, int tied_layout)
{
    for (int k = 0; k < u->n; k++) {
        const mf_hf_tensor *t = &in->m->t[u->t[k]];
        const char *name = mf_init_tensor_name(in, u, k);
        fprintf(out, "  tensor \"");
        mf_init_put(out, name, strlen(name));
        fprintf(out, "\" [");
        for (int d = 0; d < t->ndims; d++)
            fprintf(out, "%s%" PRId64, d ? ", " : "", t->dims[d]);
        fprintf(out, "]%s;\n", tied_layout && in->ties.tied[u->t[k]] ? " layout tied" : "");
    }
    fprintf(out, "}\n");
}

/* Writes the units; a pattern's blocks as one loop when they are 0..N-1 in
 * order and all alike. */
static void mf_init_units(FILE *out, const mf_init *in, const char *layout, int tied_layout)
{
    for (int k = 0; k < in->nunits;) {
        const mf_init_unit *u = &in->u[k];
        int j = k + 1;
        if (u->pattern >= 0 && u->index == 0)
            while (j < in->nunits && in->u[j].pattern == u->pattern && in->u[j].index == j - k &&
                   mf_init_same(in, u, &in->u[j]))
                j++;
        if (j - k > 1) {
            const char *brace = strstr(in->pat[u->pattern], "{i}");
            fprintf(out, "\nunit \"");
            mf_init_put(out, in->pat[u->pattern], (size_t)(brace - in->pat[u->pattern]));
            fprintf(out, "{i}\" for i in 0..%d layout %s {\n", j - k, layout);
        } else {
            j = k + 1;
            fprintf(out, "\nunit \"");
            mf_init_put(out, u->name, strlen(u->name));
            fprintf(out, "\" layout %s {\n", layout);
        }
        mf_init_unit_body(out, in, u, tied_layout);
        k = j;
    }
}

static int mf_init_mesh(const char *arg, char names[MF_MAX_AXES][64], long *sizes, int *naxes)
{
    *naxes = 0;
    const char *p = arg;
    while (*p) {
        const char *eq = strchr(p, '='), *comma = strchr(p, ',');
        if (!eq || (comma && comma < eq) || eq == p || eq - p >= 64 || *naxes >= MF_MAX_AXES)
            return -1;
        snprintf(names[*naxes], 64, "%.*s", (int)(eq - p), p);
        char *end;
        sizes[*naxes] = strtol(eq + 1, &end, 10);
        if (end == eq + 1 || sizes[*naxes] < 1 || (*end && *end != ','))
            return -1;
        (*naxes)++;
        p = *end ? end + 1 : end;
    }
    return *naxes ? 0 : -1;
}

static void mf_init_place(FILE *out, const char *role, const char *dt, const char *lt, int naxes)
{
    fprintf(out, "  %-11s %s [", role, dt);
    for (int a = 0; a < naxes; a++) {
        char c = a == naxes - 1 ? lt[1] : lt[0];
        fprintf(out, "%s%s", a ? ", " : "", c == 'R' ? "Replicate" : c == 'F' ? "Flat" : "Partial");
    }
    fprintf(out, "];\n");
}

static int mf_init_write(FILE *out, const mf_init *in, const mf_init_mode *mode, char names[MF_MAX_AXES][64],
                         const long *sizes, int naxes, const char *cmdline)
{
    const mf_hf_model *m = in->m;
    int64_t elems = 0;
    for (int k = 0; k < m->n; k++)
        elems += m->t[k].numel;
    mf_st_dtype d0 = m->n ? m->t[0].dtype : MF_ST_F32;
    const char *wdt = d0 == MF_ST_BF16 ? "bf16" : d0 == MF_ST_F16 ? "fp16" : "fp32";
    fprintf(out, "# Generated by `mfsdpc init %s`\n# from %d tensors (%" PRId64 " elements).\n", cmdline, m->n,
            elems);
    int ntied = 0, whole = strchr(mode->w, 'F') == NULL; /* the mode's weight is replicated already */
    for (int k = 0; k < m->n; k++)
        ntied += in->ties.tied[k];
    for (int i = 0; i < in->ties.nnotes; i++)
        fprintf(out, "# %s\n", in->ties.notes[i]);
    for (int j = 0; j < m->n; j++) {
        const char *name = mf_init_name(in, j);
        if (!in->ties.dropped[j] && mf_init_rootless(name))
            fprintf(out, "# \"%s\" has no unit prefix: here it is \"%s.%s\" (import with the rule %s=%s.%s)\n", name,
                    MF_INIT_ROOT, name, name, MF_INIT_ROOT, name);
    }
    fprintf(out, "mesh ");
    for (int a = 0; a < naxes; a++)
        fprintf(out, "%s%s = %ld", a ? ", " : "", names[a], sizes[a]);
    fprintf(out, ";\nmicrobatches 1;\nreduce avg;\n\nlayout %s {\n", mode->name);
    mf_init_place(out, "weight", wdt, mode->w, naxes);
    mf_init_place(out, "grad", "fp32", mode->g, naxes);
    mf_init_place(out, "main_weight", "fp32", mode->m, naxes);
    fprintf(out, "}\n");
    if (ntied && !whole) {
        fprintf(out, "\n# read outside its unit's windows (tied): the weight whole on every rank\nlayout tied {\n");
        mf_init_place(out, "weight", wdt, "RR", naxes);
        mf_init_place(out, "grad", "fp32", mode->g, naxes);
        mf_init_place(out, "main_weight", "fp32", mode->m, naxes);
        fprintf(out, "}\n");
    }
    mf_init_units(out, in, mode->name, ntied && !whole);
    return ferror(out) ? -1 : 0;
}

/* The command line's arguments. */
typedef struct mf_init_args {
    const char *model, *mesh, *layout, *out;
} mf_init_args;

/* "bad option A V" when A has a value after it; the usage follows. */
static int mf_init_bad(const mf_opts *p, const char *a)
{
    if (p->i < p->argc)
        fprintf(stderr, "mfsdpc: error: bad option %s %s\n", a, p->argv[p->i]);
    mf_init_usage(stderr);
    return 2;
}

/* Parses argv into a and in->pat. -1 to go on, else the exit status (0
 * after --help). */
static int mf_init_parse(int argc, char **argv, mf_init_args *a, mf_init *in)
{
    enum { O_HELP, O_MESH, O_LAYOUT, O_OUT, O_UNIT };
    static const mf_opt opts[] = {{"--help", "-h", NULL, O_HELP}, {"--mesh", NULL, "a mesh", O_MESH},
                                  {"--layout", NULL, "a mode", O_LAYOUT}, {"-o", NULL, "a file name", O_OUT},
                                  {"--unit", NULL, "a pattern", O_UNIT}};
    mf_opts p;
    mf_opts_init(&p, "mfsdpc init", argc, argv, opts, 5, NULL);
    p.quiet = true; /* worded here, as before the shared parser */
    int id;
    const char *v;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == O_HELP) {
            mf_init_usage(stdout);
            return 0;
        }
        if (id == MF_OPTS_OPERAND && !a->model)
            a->model = v;
        else if (id == O_MESH)
            a->mesh = v;
        else if (id == O_LAYOUT)
            a->layout = v;
        else if (id == O_OUT)
            a->out = v;
        else if (id == O_UNIT && in->npat < MF_INIT_MAX_PATTERNS && strstr(v, "{i}"))
            in->pat[in->npat++] = v;
        else if (id == O_UNIT)
            return fprintf(stderr, "mfsdpc: error: bad option --unit %s\n", v), mf_init_usage(stderr), 2;
        else if (id == MF_OPTS_NO_VALUE)
            return mf_init_usage(stderr), 2;
        else
            return mf_init_bad(&p, p.arg);
    }
    return -1;
}

int mf_cmd_init(int argc, char **argv)
{
    mf_init_args args = {0};
    mf_init in = {0};
    int prc = mf_init_parse(argc, argv, &args, &in);
    if (prc >= 0)
        return prc;
    const char *model = args.model, *mesh = args.mesh, *layout = args.layout, *outp = args.out;
    char names[MF_MAX_AXES][64];
    long sizes[MF_MAX_AXES];
    int naxes = 0;
    const mf_init_mode *mode = NULL;
    for (size_t k = 0; layout && k < MF_INIT_NMODES; k++)
        if (!strcmp(layout, mf_init_modes[k].name))
            mode = &mf_init_modes[k];
    if (layout && !mode) {
        fprintf(stderr, "mfsdpc: error: unknown layout '%s' for --layout; use one of ", layout);
        mf_init_mode_list(stderr);
        return fprintf(stderr, "\n"), 2;
    }
    if (!model || !mesh || !mode || mf_init_mesh(mesh, names, sizes, &naxes) != 0) {
        fprintf(stderr, "mfsdpc: error: init needs MODEL, --mesh AXIS=N[,...] and --layout MODE\n");
        return mf_init_usage(stderr), 2;
    }
    if (mode->two_axes && naxes < 2)
        return fprintf(stderr, "mfsdpc: error: --layout %s needs a mesh of at least two axes\n", mode->name), 2;
    mf_hf_model m;
    char err[4096], cmdline[2048] = "";
    if (mf_ckpt_hf_open(model, &m, err, sizeof err) != 0)
        return fprintf(stderr, "mfsdpc: error: %s\n", err), 1;
    for (int i = 1, at = 0; i < argc && at < (int)sizeof cmdline - 1; i++)
        at += snprintf(cmdline + at, sizeof cmdline - (size_t)at, "%s%s", i > 1 ? " " : "", argv[i]);
    in.m = &m;
    int rc = 1;
    if (mf_init_ties_find(&m, model, &in.ties, err, sizeof err) != 0)
        fprintf(stderr, "mfsdpc: error: %s\n", err);
    else
        rc = mf_init_group(&in);
    if (rc == 0) {
        char tmp[4200];
        FILE *out = stdout;
        if (outp) {
            snprintf(tmp, sizeof tmp, "%.4000s.tmp-%ld", outp, (long)getpid());
            if (!(out = fopen(tmp, "w"))) {
                fprintf(stderr, "mfsdpc: error: cannot create %s: %s\n", tmp, strerror(errno));
                rc = 2;
            }
        }
        if (out && (mf_init_write(out, &in, mode, names, sizes, naxes, cmdline) != 0 ||
                    (outp && (fclose(out) != 0 || rename(tmp, outp) != 0)))) {
            fprintf(stderr, "mfsdpc: error: cannot write %s\n", outp ? outp : "standard output");
            if (outp)
                unlink(tmp);
            rc = 2;
        }
    }
    for (int k = 0; k < in.nunits; k++) {
        free(in.u[k].name);
        free(in.u[k].t);
    }
    free(in.u);
    mf_init_ties_free(&in.ties, m.n);
    mf_ckpt_hf_close(&m);
    return rc;
}
