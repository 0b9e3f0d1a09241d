/*
 * mf_ckpt_hf_global: the global model of a schedule for the Hugging Face
 * export and import, and the mapping of a coordinate's local elements onto
 * it (see the header).
 */
#include "mf_ckpt_hf_global.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_ckpt_plan.h"
#include "mf_free.h"

void mf_hf_global_free(mf_hf_global *g)
{
    MF_FREE_ALL(g->shape, g->slot, g->at, g->tbase);
    memset(g, 0, sizeof *g);
}

static bool mf_hf_global_distinct(const mf_schedule *s, int b)
{
    return mf_placement_has_distinct(&s->buckets[b].place[MF_ROLE_WEIGHT], s->mesh.naxes);
}

/* The global tensor of tensor i of bucket b at coordinate combination c
 * (c = 0 when the bucket has no Distinct axis), appended to g->shape unless
 * a split tensor's W already is (c > 0); its slot recorded. */
static void mf_hf_global_add(const mf_schedule *s, int b, int i, int64_t c, mf_hf_global *g)
{
    const mf_tensor *t = &s->buckets[b].tensors[i];
    int *slot = &g->slot[g->at[g->tbase[b] + i]];
    int64_t run, grow, gbase, dims[MF_MAX_DIMS];
    if (!mf_hf_global_distinct(s, b)) {
        slot[0] = g->n;
        mf_hf_shape_init(&g->shape[g->n++], t->name, t->ndims, t->dims, t->numel);
    } else if (!t->global_split) {
        slot[c] = g->n;
        mf_hf_shape_init(&g->shape[g->n++], t->global[c], t->ndims, t->dims, t->numel);
    } else if (c > 0) {
        slot[c] = slot[0];
    } else {
        slot[0] = g->n;
        mf_ckpt_plan_gmap(s, b, i, 0, &run, &grow, &gbase, dims);
        mf_hf_shape_init(&g->shape[g->n++], t->global[0], t->ndims, dims, t->numel * mf_ckpt_plan_combos(s, b));
    }
}

/* -1 with a message naming the first Distinct tensor of s without global
 * names and the clause that gives them; else 0. */
static int mf_hf_global_check(const mf_schedule *s, char *err, size_t errlen)
{
    for (int b = 0; b < s->nbuckets; b++)
        for (int i = 0; mf_hf_global_distinct(s, b) && i < s->buckets[b].ntensors; i++) {
            const mf_tensor *t = &s->buckets[b].tensors[i];
            if (t->nglobal)
                continue;
            snprintf(err, errlen,
                     "tensor '%s' of bucket '%s' is Distinct (each coordinate holds a different tensor under "
                     "this name) and has no global name: the Hugging Face export/import writes and reads the "
                     "whole model's tensors; give it 'global \"TEMPLATE\"' or 'global \"NAME\" split D' in the "
                     "spec (docs/language.md §3.4; fully_shard: global_names=)",
                     t->name, s->buckets[b].name);
            return -1;
        }
    return 0;
}

/* Counts the global tensors (*ng) and the slots (*ns) of s. */
static int64_t mf_hf_global_count(const mf_schedule *s, int64_t *ng, int64_t *ns)
{
    int64_t nt = 0;
    *ng = *ns = 0;
    for (int b = 0; b < s->nbuckets; b++)
        for (int i = 0; i < s->buckets[b].ntensors; i++, nt++) {
            int64_t nc = mf_ckpt_plan_combos(s, b);
            *ng += s->buckets[b].tensors[i].global_split ? 1 : nc;
            *ns += nc;
        }
    return nt;
}

int mf_hf_global_build(const mf_schedule *s, mf_hf_global *g, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    if (mf_hf_global_check(s, err, errlen) != 0)
        return -1;
    int64_t ng, ns, nt = mf_hf_global_count(s, &ng, &ns);
    g->shape = calloc((size_t)ng + 1, sizeof *g->shape);
    g->slot = calloc((size_t)ns + 1, sizeof *g->slot);
    g->at = calloc((size_t)nt + 1, sizeof *g->at);
    g->tbase = calloc((size_t)s->nbuckets + 1, sizeof *g->tbase);
    if (!g->shape || !g->slot || !g->at || !g->tbase || ng > INT32_MAX || ns > INT32_MAX) {
        mf_hf_global_free(g);
        return snprintf(err, errlen, "out of memory (global tensors)"), -1;
    }
    for (int b = 0, at = 0; b < s->nbuckets; b++) {
        int64_t nc = mf_ckpt_plan_combos(s, b);
        g->tbase[b + 1] = g->tbase[b] + s->buckets[b].ntensors;
        for (int i = 0; i < s->buckets[b].ntensors; i++, at += (int)nc)
            g->at[g->tbase[b] + i] = at;
        for (int64_t c = 0; c < nc; c++) /* the checkpoint plan's order */
            for (int i = 0; i < s->buckets[b].ntensors; i++)
                mf_hf_global_add(s, b, i, c, g);
    }
    return 0;
}

int mf_hf_global_find(const mf_hf_global *g, const char *name)
{
    for (int k = 0; k < g->n; k++)
        if (strcmp(g->shape[k].name, name) == 0)
            return k;
    return -1;
}

mf_hf_place mf_hf_global_place(const mf_hf_global *g, const mf_schedule *s, int bucket, int index, int64_t coord)
{
    mf_hf_place p = {.global = g->slot[g->at[g->tbase[bucket] + index] + (coord > 0 ? coord : 0)]};
    mf_ckpt_plan_gmap(s, bucket, index, coord, &p.run, &p.grow, &p.gbase, NULL);
    return p;
}

void mf_hf_global_run(const mf_hf_place *p, int64_t at, int64_t end, mf_hf_run *r)
{
    int64_t outer = p->run > 0 ? at / p->run : 0, w = at - outer * p->run;
    int64_t stop = p->run > 0 && (outer + 1) * p->run < end ? (outer + 1) * p->run : end;
    *r = (mf_hf_run){.local = at, .global = outer * p->grow + p->gbase + w, .n = stop - at};
}
