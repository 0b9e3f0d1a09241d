/*
 * mf_plan_mem: the allocated bytes per rank of an assigned schedule with the
 * optimizer state added (see mf_plan_mem.h).
 */
#include "mf_plan_mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_int.h"
#include "mf_human.h"
#include "mf_plan_stats.h"


/* The main_weight elements rank r holds over the buckets that are ragged
 * (`ragged`) or not. */
static int64_t held_main(const mf_schedule *s, int64_t r, bool ragged)
{
    int64_t elems = 0;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        if ((bk->bounds != NULL) == ragged)
            elems = mf_sat_add(elems, mf_layout_bucket_range(&s->mesh, bk, &bk->place[MF_ROLE_MAIN_WEIGHT], r).len);
    }
    return elems;
}

int64_t mf_plan_mem_optimizer_bytes(const mf_schedule *s, int64_t optimizer_bytes)
{
    bool ragged = false;
    for (int b = 0; b < s->nbuckets; b++)
        ragged = ragged || s->buckets[b].bounds;
    /* equal shards: every rank holds as much; ragged: the most over the ranks */
    int64_t most = 0;
    for (int64_t r = 0; ragged && r < s->mesh.world; r++) {
        int64_t e = held_main(s, r, true);
        most = e > most ? e : most;
    }
    return mf_sat_mul(mf_sat_add(held_main(s, 0, false), most), optimizer_bytes);
}

void mf_plan_mem_of(const mf_schedule *s, int64_t optimizer_bytes, mf_plan_mem *out)
{
    memset(out, 0, sizeof *out);
    out->persistent = s->mem_persistent;
    out->arena = s->mem_transient;
    out->allocated = mf_sat_add(s->mem_persistent, s->mem_transient);
    out->optimizer = mf_plan_mem_optimizer_bytes(s, optimizer_bytes);
    out->peak = mf_sat_add(out->allocated, out->optimizer);
    for (int b = 0; b < s->nbuckets; b++)
        out->per_rank = out->per_rank || s->buckets[b].bounds;
}

int mf_plan_mem_parse_optimizer_bytes(const char *cmd, const char *v, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : -1;
    if (!v || end == v || *end != '\0' || errno != 0 || x < 0 || x > 1024) {
        fprintf(stderr, "%s: error: --optimizer-bytes needs an integer from 0 to 1024 (bytes of optimizer "
                        "state per parameter, e.g. 8 for Adam), got '%s'\n", cmd, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

int mf_plan_mem_parse_size(const char *cmd, const char *opt, const char *v, int64_t *out)
{
    static const struct { const char *suf; double mult; } sufs[] = {
        {"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
        {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
    char *end = NULL;
    errno = 0;
    double x = v ? strtod(v, &end) : -1;
    if (v && end != v && errno == 0 && x > 0) {
        for (size_t k = 0; k < sizeof sufs / sizeof sufs[0]; k++)
            if (strcmp(end, sufs[k].suf) == 0 && x * sufs[k].mult < 9.2e18 && x * sufs[k].mult >= 1) {
                *out = (int64_t)(x * sufs[k].mult);
                return 0;
            }
    }
    fprintf(stderr, "%s: error: %s needs a positive size in bytes with an optional suffix B, KiB, MiB, GiB, "
                    "TiB (or KB, MB, GB, TB), e.g. 80GiB; got '%s'\n", cmd, opt, v ? v : "");
    return -1;
}

void mf_plan_mem_print(FILE *out, const mf_plan_mem *m, int64_t optimizer_bytes)
{
    char h1[32], h2[32], h3[32];
    fprintf(out, "plan/rank    %s (%lld bytes) = allocated %s (%lld bytes) + optimizer state %s (%lld bytes per "
                 "main_weight element held): what `mfsdpc plan` budgets%s\n",
            mf_human_bytes(m->peak, h1, sizeof h1), (long long)m->peak, mf_human_bytes(m->allocated, h2, sizeof h2),
            (long long)m->allocated, mf_human_bytes(m->optimizer, h3, sizeof h3), (long long)optimizer_bytes,
            m->per_rank ? "; ragged whole buckets: each term the most over the ranks" : "");
}
