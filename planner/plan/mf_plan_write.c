/*
 * mf_plan_write: rewrites the input spec with the planner's choices (see
 * mf_plan_write.h). Works on the text, by byte offsets computed from the
 * AST's spans, with a list of edits sorted by offset and applied in one pass.
 */
#include "mf_plan_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_ast.h"
#include "mf_int.h"

typedef struct edit {
    size_t at, del;
    char text[160];
    int seq;                /* equal offsets apply in the order added */
} edit;

/* Byte offset of a 1-based line and column. */
static size_t offset_of(const char *src, size_t len, int line, int col)
{
    size_t i = 0;
    for (int l = 1; l < line && i < len; i++)
        if (src[i] == '\n')
            l++;
    return i + (size_t)(col - 1) <= len ? i + (size_t)(col - 1) : len;
}

/* Offset just after the first '{' at or after i, skipping comments. */
static size_t after_brace(const char *src, size_t len, size_t i)
{
    for (; i < len; i++) {
        if (src[i] == '#')
            while (i < len && src[i] != '\n')
                i++;
        else if (src[i] == '{')
            return i + 1;
    }
    return len;
}

/* Offset of the start of the line after the statement that begins at i. */
static size_t after_statement(const char *src, size_t len, size_t i)
{
    while (i < len && src[i] != ';')
        i++;
    while (i < len && src[i] != '\n')
        i++;
    return i < len ? i + 1 : len;
}

static int edit_cmp(const void *a, const void *b)
{
    const edit *x = a, *y = b;
    int c = mf_cmp_i64(x->at, y->at);
    return c ? c : x->seq - y->seq;
}

static bool ast_sets(const mf_ast *ast, mf_ast_setting_kind k)
{
    for (const mf_ast_setting *s = ast->settings; s; s = s->next)
        if (s->kind == k)
            return true;
    return false;
}

static void size_text(int64_t v, char *buf, size_t n)
{
    if (v % (INT64_C(1) << 30) == 0)
        snprintf(buf, n, "%lldGiB", (long long)(v >> 30));
    else if (v % (INT64_C(1) << 20) == 0)
        snprintf(buf, n, "%lldMiB", (long long)(v >> 20));
    else
        snprintf(buf, n, "%lld", (long long)v);
}

char *mf_plan_write_spec(const mf_plan_search *ps, const mf_ast *ast, const char *src, size_t len,
                         const mf_ps_point *pt, const char *header)
{
    edit *ed = calloc((size_t)ps->ngroups * 2 + 4, sizeof *ed);
    int ne = 0;
    if (!ed)
        return NULL;
    int g = 0;
    for (const mf_ast_unit *d = ast->units; d && g < ps->ngroups; d = d->next, g++) {
        const mf_ps_group *gr = &ps->groups[g];
        if (!gr->is_auto)
            continue;
        const mf_ps_choice *ch = &gr->choices[pt->choice[g]];
        size_t at = offset_of(src, len, d->layout.span.line, d->layout.span.col);
        size_t end = offset_of(src, len, d->layout.span.end_line, d->layout.span.end_col);
        ed[ne] = (edit){at, end - at, "", 0};
        snprintf(ed[ne++].text, sizeof ed[0].text, "%s", ps->spec.layouts[ch->layout].name);
        if (!gr->reshard_set && !ch->reshard) {
            /* on a line of its own after the brace, unless more follows it */
            size_t at2 = after_brace(src, len, end), k = at2;
            while (k < len && (src[k] == ' ' || src[k] == '\t' || src[k] == '\r'))
                k++;
            bool alone = k >= len || src[k] == '\n' || src[k] == '#';
            while (alone && k < len && src[k] != '\n')
                k++;
            ed[ne] = (edit){alone ? (k < len ? k + 1 : len) : at2, 0, "", 0};
            snprintf(ed[ne++].text, sizeof ed[0].text, alone ? "  reshard_after_forward false;   # chosen by mfsdpc plan\n"
                                                             : " reshard_after_forward false;");
        }
    }
    size_t mesh_end = ast->meshes ? after_statement(src, len, offset_of(src, len, ast->meshes->span.line,
                                                                        ast->meshes->span.col))
                                  : 0;
    if (!ast_sets(ast, MF_AST_SET_PREFETCH) && pt->prefetch != 1) {
        ed[ne] = (edit){mesh_end, 0, "", 0};
        snprintf(ed[ne++].text, sizeof ed[0].text, "prefetch %d;                      # chosen by mfsdpc plan\n",
                 pt->prefetch);
    }
    if (!ast_sets(ast, MF_AST_SET_BUCKET_SIZE) && pt->bucket_size != 0) {
        char b[32];
        size_text(pt->bucket_size, b, sizeof b);
        ed[ne] = (edit){mesh_end, 0, "", 0};
        snprintf(ed[ne++].text, sizeof ed[0].text, "bucket_size %s;               # chosen by mfsdpc plan\n", b);
    }
    for (int i = 0; i < ne; i++)
        ed[i].seq = i;
    qsort(ed, (size_t)ne, sizeof *ed, edit_cmp);
    size_t cap = len + 1 + (header ? strlen(header) + 4 : 0);
    for (int i = 0; i < ne; i++)
        cap += strlen(ed[i].text);
    char *out = malloc(cap);
    if (!out) {
        free(ed);
        return NULL;
    }
    size_t o = 0;
    if (header)
        o += (size_t)snprintf(out, cap, "# %s\n", header);
    size_t pos = 0;
    for (int i = 0; i < ne; i++) {
        size_t at = ed[i].at;
        memcpy(out + o, src + pos, at - pos);
        o += at - pos;
        size_t tl = strlen(ed[i].text);
        memcpy(out + o, ed[i].text, tl);
        o += tl;
        pos = at + ed[i].del;
    }
    memcpy(out + o, src + pos, len - pos);
    o += len - pos;
    out[o] = '\0';
    free(ed);
    return out;
}
