/*
 * mf_diag: renders diagnostics the way GCC and Clang do: a located header
 * line, the source line, and a caret with tildes under the span.
 */
#include "mf_diag.h"

#include <stdarg.h>
#include <string.h>

enum { MF_DIAG_DEFAULT_MAX = 100 };

void mf_diag_init(mf_diag *d, const mf_source *src, FILE *out)
{
    memset(d, 0, sizeof *d);
    d->src = src;
    d->out = out ? out : stderr;
    d->max_errors = MF_DIAG_DEFAULT_MAX;
}

/* Finds line `line` (1-based) of the source; returns its start and length. */
static const char *source_line(const mf_source *src, int line, size_t *len)
{
    if (!src || !src->text || line < 1)
        return NULL;
    const char *p = src->text, *end = src->text + src->len;
    for (int l = 1; l < line; l++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            return NULL;
        p = nl + 1;
    }
    const char *e = p;
    while (e < end && *e != '\n' && *e != '\r')
        e++;
    *len = (size_t)(e - p);
    return p;
}

/* The most source bytes one snippet echoes: a longer line is shown as a
 * window around the caret with "..." on the cut sides, so 100 errors on a
 * 1 MB line print 100 short snippets, not 100 MB. */
enum { MF_DIAG_SNIPPET_MAX = 256 };

static void print_snippet(mf_diag *d, mf_span at)
{
    size_t len;
    const char *line = source_line(d->src, at.line, &len);
    if (!line)
        return;
    int col = at.col < 1 ? 1 : at.col;
    if ((size_t)col > len + 1)
        col = (int)len + 1;
    int last = (at.end_line == at.line && at.end_col > col) ? at.end_col : col + 1;
    if ((size_t)last > len + 1)
        last = (int)len + 1;
    /* the window [from, to) of the line, from at most a third before the caret */
    size_t from = 0, to = len;
    if (len > MF_DIAG_SNIPPET_MAX) {
        from = (size_t)col - 1 > MF_DIAG_SNIPPET_MAX / 3 ? (size_t)col - 1 - MF_DIAG_SNIPPET_MAX / 3 : 0;
        while (from > 0 && ((unsigned char)line[from] & 0xc0) == 0x80)
            from--; /* never split a UTF-8 sequence */
        to = from + MF_DIAG_SNIPPET_MAX < len ? from + MF_DIAG_SNIPPET_MAX : len;
        while (to < len && ((unsigned char)line[to] & 0xc0) == 0x80)
            to++;
    }
    const char *pre = from > 0 ? "..." : "";
    char gutter[16];
    int w = snprintf(gutter, sizeof gutter, "%d", at.line);
    fprintf(d->out, " %s | %s", gutter, pre);
    for (size_t i = from; i < to; i++)
        fputc(line[i] == '\t' ? ' ' : (line[i] == '\0' ? ' ' : line[i]), d->out);
    fprintf(d->out, "%s\n", to < len ? "..." : "");
    fprintf(d->out, " %*s | %s", w, "", from > 0 ? "   " : "");
    for (size_t i = from + 1; i < (size_t)col; i++)
        fputc(' ', d->out);
    fputc('^', d->out);
    for (size_t i = (size_t)col + 1; i < (size_t)last && i <= to; i++)
        fputc('~', d->out);
    fputc('\n', d->out);
}

__attribute__((format(printf, 4, 0)))
static void report(mf_diag *d, const char *kind, mf_span at, const char *fmt, va_list ap)
{
    const char *path = d->src && d->src->path ? d->src->path : "<input>";
    if (at.line > 0)
        fprintf(d->out, "%s:%d:%d: %s: ", path, at.line, at.col, kind);
    else
        fprintf(d->out, "%s: %s: ", path, kind);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    if (at.line > 0)
        print_snippet(d, at);
}

/* Reports unless the errors are past the limit: once they are, only the
 * counts go on (the caller counts, suppressed errors too). */
__attribute__((format(printf, 4, 0)))
static void report_capped(mf_diag *d, const char *kind, mf_span at, const char *fmt, va_list ap)
{
    if (d->nerrors > d->max_errors)
        return;
    report(d, kind, at, fmt, ap);
}

/* The body of a variadic mf_diag_<kind>(d, at, fmt, ...): its arguments to
 * report_capped. */
#define MF_DIAG_FORWARD(kind)                           \
    do {                                                \
        va_list ap;                                     \
        va_start(ap, fmt);                              \
        report_capped(d, kind, at, fmt, ap);            \
        va_end(ap);                                     \
    } while (0)

void mf_diag_error(mf_diag *d, mf_span at, const char *fmt, ...)
{
    if (++d->nerrors > d->max_errors)
        d->suppressed++;
    MF_DIAG_FORWARD("error");
}

void mf_diag_warning(mf_diag *d, mf_span at, const char *fmt, ...)
{
    d->nwarnings++;
    MF_DIAG_FORWARD("warning");
}

void mf_diag_note(mf_diag *d, mf_span at, const char *fmt, ...)
{
    MF_DIAG_FORWARD("note");
}

void mf_diag_finish(mf_diag *d)
{
    if (d->suppressed > 0)
        fprintf(d->out, "%s: note: %d more errors not shown (limit is %d); %d errors in all\n",
                d->src && d->src->path ? d->src->path : "<input>", d->suppressed, d->max_errors,
                d->nerrors);
    fflush(d->out);
}

mf_span mf_span_join(mf_span a, mf_span b)
{
    mf_span r = a;
    if (b.line > r.end_line || (b.line == r.end_line && b.end_col > r.end_col)) {
        r.end_line = b.end_line;
        r.end_col = b.end_col;
    }
    return r;
}

/* Edit distance counting an adjacent transposition as one edit (optimal
 * string alignment), capped: returns cap + 1 for anything farther. */
static size_t edit_distance(const char *a, const char *b, size_t cap)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return cap + 1;
    if ((la > lb ? la - lb : lb - la) > cap)
        return cap + 1;
    size_t rows[3][65];
    size_t *prev2 = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = prev[j - 1] + cost;
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && prev2[j - 2] + 1 < best)
                best = prev2[j - 2] + 1;
            cur[j] = best;
        }
        size_t *t = prev2;
        prev2 = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb];
}

static bool same_ignoring_case(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        int ca = (unsigned char)*a, cb = (unsigned char)*b;
        if (ca >= 'A' && ca <= 'Z')
            ca += 'a' - 'A';
        if (cb >= 'A' && cb <= 'Z')
            cb += 'a' - 'A';
        if (ca != cb)
            return false;
    }
    return *a == *b;
}

const char *mf_diag_suggest(const char *word, const char *const *cands, size_t n)
{
    if (!word || !*word)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (cands[i] && same_ignoring_case(word, cands[i]))
            return cands[i];
    /* A typo is at most one edit in short words and a third of a long one. */
    size_t len = strlen(word);
    size_t cap = len <= 4 ? 1 : len / 3;
    const char *best = NULL;
    size_t best_d = cap + 1;
    for (size_t i = 0; i < n; i++) {
        if (!cands[i])
            continue;
        size_t dist = edit_distance(word, cands[i], cap);
        if (dist < best_d) {
            best_d = dist;
            best = cands[i];
        }
    }
    return best;
}

void mf_diag_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
