/*
 * mf_plan_muon: the embedding and the head of a spec, for the Muon recipe
 * (see the header).
 */
#include "mf_plan_muon.h"

#include <stdlib.h>
#include <string.h>

/* Unit u was expanded from a `for` loop: another unit shares its span. */
static bool in_loop(const mf_spec *spec, int u)
{
    const mf_span *a = &spec->units[u].span;
    for (int v = 0; v < spec->nunits; v++)
        if (v != u && spec->units[v].span.line == a->line && spec->units[v].span.col == a->col)
            return true;
    return false;
}

/* The rows of the first unit's first 2-D tensor when that unit is outside
 * every loop and some unit is inside one; 0 otherwise. */
static int64_t vocabulary(const mf_spec *spec, const bool *loop)
{
    bool blocks = false;
    for (int u = 0; u < spec->nunits; u++)
        blocks |= loop[u];
    if (!blocks || spec->nunits == 0 || loop[0])
        return 0;
    const mf_spec_unit *first = &spec->units[0];
    for (int i = 0; i < first->ntensors; i++)
        if (first->tensors[i].ndims == 2)
            return first->tensors[i].dims[0];
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The AdamW tensors' full names into names (NULL: only count them). */
static int walk(const mf_spec *spec, const bool *loop, int64_t vocab, const char **names)
{
    int n = 0;
    for (int u = 0; u < spec->nunits && vocab > 0; u++) {
        const mf_spec_unit *su = &spec->units[u];
        for (int i = 0; !loop[u] && i < su->ntensors; i++) {
            const mf_spec_tensor *t = &su->tensors[i];
            if (t->ndims == 2 && t->dims[0] == vocab) {
                if (names)
                    names[n] = t->name;
                n++;
            }
        }
    }
    return n;
}

int mf_plan_muon_adamw(const mf_spec *spec, const char ***out)
{
    *out = NULL;
    bool *loop = calloc((size_t)(spec->nunits ? spec->nunits : 1), sizeof *loop);
    if (!loop)
        return -1;
    for (int u = 0; u < spec->nunits; u++)
        loop[u] = in_loop(spec, u);
    int64_t vocab = vocabulary(spec, loop);
    int n = walk(spec, loop, vocab, NULL);
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    if (names)
        walk(spec, loop, vocab, names);
    free(loop);
    if (!names)
        return -1;
    qsort(names, (size_t)n, sizeof *names, by_name);
    *out = names;
    return n;
}

bool mf_plan_muon_is_adamw(const char *const *names, int n, const char *name)
{
    return n > 0 && bsearch(&name, names, (size_t)n, sizeof *names, by_name) != NULL;
}
