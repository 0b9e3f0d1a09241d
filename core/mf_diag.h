/*
 * mf_diag: source spans and GCC/Clang-style diagnostics.
 *
 *   file:line:col: error: message
 *    12 |   grad fp32 [Flat, Partial];
 *       |              ^~~~
 *   file:line:col: note: related declaration
 *
 * Errors accumulate in an mf_diag context; every pass checks mf_diag_errors()
 * and the pipeline stops when it is non-zero. Nothing here exits or jumps.
 * The file name printed is the path exactly as given on the command line.
 */
#ifndef MF_DIAG_H
#define MF_DIAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* A half-open source range; lines and columns are 1-based. line == 0 means
 * "no location" (the diagnostic is printed as "file: error: ..."). */
typedef struct mf_span {
    int line, col;          /* first character */
    int end_line, end_col;  /* one past the last character */
} mf_span;

typedef struct mf_source {
    const char *path;       /* as given by the user; borrowed */
    const char *text;       /* whole file; borrowed; need not be NUL-terminated */
    size_t len;             /* bytes */
} mf_source;

typedef struct mf_diag {
    const mf_source *src;   /* borrowed */
    FILE *out;              /* where diagnostics go (stderr, or a memstream in tests) */
    int nerrors;
    int nwarnings;
    int max_errors;         /* stop printing (but keep counting) past this; 0 = 100 */
    int suppressed;         /* errors not printed because of max_errors */
} mf_diag;

/* Initializes a context; out defaults to stderr when NULL. */
void mf_diag_init(mf_diag *d, const mf_source *src, FILE *out);

void mf_diag_error(mf_diag *d, mf_span at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void mf_diag_warning(mf_diag *d, mf_span at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A note attached to the previous error or warning (skipped when that one was
 * suppressed). */
void mf_diag_note(mf_diag *d, mf_span at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prints the "N errors generated." trailer when there were errors beyond the limit. */
void mf_diag_finish(mf_diag *d);

static inline int mf_diag_errors(const mf_diag *d) { return d->nerrors; }

/*
 * "Did you mean" support: returns the candidate closest to `word` (edit
 * distance, case-insensitive matches first) when it is close enough to be a
 * plausible typo, else NULL. cands: n borrowed strings; returns one of them.
 */
const char *mf_diag_suggest(const char *word, const char *const *cands, size_t n);

/* printf into a caller's error buffer err[0..errlen) (the "char *err, size_t
 * errlen" convention of the loader, the simulator and the runtime); does
 * nothing when err is NULL or errlen is 0. */
void mf_diag_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A span covering a and b. */
mf_span mf_span_join(mf_span a, mf_span b);

#endif
