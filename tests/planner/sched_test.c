/*
 * Helpers for the schedule tests (sched_test.h).
 */
#include "sched_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mf_schedule *st_compile(const char *name, const char *text, bool verify, char **diag)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = verify, .diag_out = mem};
    mf_compilation c;
    int rc = mf_pipeline_compile_buffer(name, text, strlen(text), &opt, &c);
    mf_schedule *s = NULL;
    if (rc == 0 && c.plan && c.plan->sched) {
        s = c.plan->sched;
        c.plan->sched = NULL;
    }
    mf_compilation_free(&c);
    fclose(mem);
    if (diag)
        *diag = buf;
    else
        free(buf);
    return s;
}

char *st_emit(const mf_schedule *s, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&buf, &n);
    if (!mem)
        return NULL;
    int rc = mf_emit_yaml(s, mem);
    fclose(mem);
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    if (len)
        *len = n;
    return buf;
}

int st_verify(const mf_schedule *s, char **diag)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    mf_source src = {.path = "t.yaml", .text = "", .len = 0};
    mf_diag d;
    mf_diag_init(&d, &src, mem);
    d.max_errors = 1000;
    int n = mf_verify_run(s, &d);
    fclose(mem);
    if (diag)
        *diag = buf;
    else
        free(buf);
    return n;
}

static void st_place(char *out, size_t size, const char *letters)
{
    size_t at = 0;
    out[0] = '\0';
    for (const char *p = letters; *p && at < size; p++) {
        const char *name = *p == 'F' ? "Flat" : *p == 'P' ? "Partial" : "Replicate";
        int n = snprintf(out + at, size - at, "%s%s", p == letters ? "" : ", ", name);
        at += n > 0 ? (size_t)n : 0;
    }
}

char *st_mode_spec(const char *mesh, const char *w, const char *g, const char *o, int units, int microbatches,
                   const char *extra, bool keep_last)
{
    char pw[128], pg[128], po[128];
    st_place(pw, sizeof pw, w);
    st_place(pg, sizeof pg, g);
    st_place(po, sizeof po, o);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fprintf(f, "mesh %s;\nmicrobatches %d;\n%s\n", mesh, microbatches, extra ? extra : "");
    fprintf(f, "layout L {\n  weight bf16 [%s];\n  grad fp32 [%s];\n  main_weight fp32 [%s];\n}\n", pw, pg, po);
    int loop = keep_last ? units - 1 : units;
    if (loop > 0)
        fprintf(f, "unit \"u{i}\" for i in 0..%d layout L {\n  tensor \"a\" [37, 11];\n  tensor \"b\" [5];\n}\n", loop);
    if (keep_last)
        fprintf(f, "unit \"u%d\" layout L {\n  reshard_after_forward false;\n  tensor \"a\" [37, 11];\n"
                   "  tensor \"b\" [5];\n}\n", units - 1);
    fclose(f);
    return buf;
}

void st_drop_op(mf_schedule *s, int id)
{
    for (int i = id; i + 1 < s->nops; i++) {
        s->ops[i] = s->ops[i + 1];
        s->ops[i].id = i;
    }
    s->nops--;
}

int st_find_op(const mf_schedule *s, int phase, int unit, int kind, int stream, int transition, int bucket, int axis)
{
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if ((phase < 0 || (int)op->phase == phase) && (unit < 0 || op->unit == unit) &&
            (kind < 0 || (int)op->kind == kind) && (stream < 0 || (int)op->stream == stream) &&
            (transition < 0 || op->transition == transition) && (bucket < 0 || op->bucket == bucket) &&
            (axis < 0 || op->axis == axis))
            return i;
    }
    return -1;
}

int st_unit(const mf_schedule *s, const char *name)
{
    for (int i = 0; i < s->nunits; i++)
        if (strcmp(s->units[i].name, name) == 0)
            return i;
    return -1;
}

int st_bucket(const mf_schedule *s, const char *name)
{
    for (int i = 0; i < s->nbuckets; i++)
        if (strcmp(s->buckets[i].name, name) == 0)
            return i;
    return -1;
}

int st_buffer(const mf_schedule *s, const char *name)
{
    for (int i = 0; i < s->nbuffers; i++)
        if (strcmp(s->buffers[i].name, name) == 0)
            return i;
    return -1;
}

char *st_read(const char *path, size_t *len)
{
    return mf_pipeline_read_file(path, len);
}

char *st_replace(const char *text, const char *find, const char *repl)
{
    const char *at = strstr(text, find);
    if (!at) {
        fprintf(stderr, "st_replace: '%s' not in the schedule\n", find);
        abort(); /* a failed test under cmocka */
    }
    size_t pre = (size_t)(at - text), fl = strlen(find), rl = strlen(repl), tl = strlen(text);
    char *out = malloc(tl - fl + rl + 1);
    if (!out)
        abort();
    memcpy(out, text, pre);
    memcpy(out + pre, repl, rl);
    memcpy(out + pre + rl, at + fl, tl - pre - fl + 1);
    return out;
}
