/*
 * mf_pipeline: runs the passes of mf_passes.h over one spec file, up to a
 * chosen stage, stopping at the first pass that reports errors.
 */
#ifndef MF_PIPELINE_H
#define MF_PIPELINE_H

#include "mf_passes.h"

typedef enum {
    MF_STAGE_PARSE,
    MF_STAGE_SEMA,
    MF_STAGE_LAYOUT,
    MF_STAGE_TRANSITIONS,
    MF_STAGE_LOWER,
    MF_STAGE_VERIFY,
} mf_stage;

typedef struct mf_compilation {
    mf_arena *arena;        /* AST, spec */
    mf_source src;
    char *text;             /* file contents (owned) */
    mf_diag diag;
    mf_ast *ast;
    mf_spec *spec;
    mf_plan *plan;          /* owned; plan->sched is the schedule */
} mf_compilation;

typedef struct mf_compile_options {
    mf_stage stop_after;    /* last stage to run */
    bool verify;            /* run the verifier when stop_after >= MF_STAGE_VERIFY */
    const mf_cost_model *cost; /* NULL = defaults for the spec's mesh */
    int ncost_args;         /* cost options from the command line, applied once the mesh is known */
    char **cost_args;
    FILE *diag_out;         /* NULL = stderr */
} mf_compile_options;

/*
 * Reads and compiles `path`. Returns 0 on success, 1 when the input had errors
 * (diagnostics printed), 2 when the file could not be read or an option was
 * malformed (message printed). c must be released with mf_compilation_free()
 * whatever the result.
 */
int mf_pipeline_compile_file(const char *path, const mf_compile_options *opt, mf_compilation *c);
/* Same, from a buffer (for tests and fuzzers); path is only for messages. */
int mf_pipeline_compile_buffer(const char *path, const char *text, size_t len,
                               const mf_compile_options *opt, mf_compilation *c);
void mf_compilation_free(mf_compilation *c);

/* Reads a whole file; returns owned NUL-terminated text or NULL (errno set). */
char *mf_pipeline_read_file(const char *path, size_t *len);

/*
 * Writes a file atomically: `write` is called with a temporary file in the
 * same directory, which is renamed over `path` only when write returned 0 and
 * every byte reached the disk; otherwise the temporary is removed and `path`
 * is untouched. Refuses to write over `protect` (the input) when non-NULL.
 * Returns 0, or -1 with a message on stderr.
 */
int mf_pipeline_write_file_atomic(const char *path, const char *protect,
                                  int (*write)(FILE *out, const void *ctx), const void *ctx);

#endif
