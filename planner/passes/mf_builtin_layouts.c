/*
 * mf_builtin_layouts: the table of built-in layouts (see mf_builtin_layouts.h
 * and docs/plan.md §1).
 *
 * A role's pattern is written per mesh axis, outermost first, in the letters
 * of the placement names (R = Replicate, F = Flat, P = Partial, W = Whole,
 * D = Distinct):
 *   one letter      the same placement on every axis;
 *   two letters     the outermost axis, then every axis inside it;
 *   naxes letters   each axis (for the entries of a single rank).
 */
#include "mf_builtin_layouts.h"

#include <string.h>

typedef struct mf_builtin {
    const char *name;
    int min_axes, max_axes;
    const char *weight, *grad, *main_weight;
    const char *ranks;      /* for messages */
} mf_builtin;

static const mf_builtin table[] = {
    /* name                      axes  weight  grad   main    */
    {"ddp",                      1, 3, "R",    "P",   "R",    "1, 2 or 3"},
    {"zero1",                    1, 3, "R",    "P",   "F",    "1, 2 or 3"},
    {"zero2",                    1, 3, "R",    "F",   "F",    "1, 2 or 3"},
    {"zero3",                    1, 3, "F",    "F",   "F",    "1, 2 or 3"},
    {"hsdp",                     2, 3, "RF",   "PF",  "RF",   "2 or 3"},
    {"hsdp_nosync",              2, 3, "RF",   "P",   "RF",   "2 or 3"},
    {"hfsdp",                    2, 3, "RF",   "PF",  "F",    "2 or 3"},
    {"zero2_inner_zero1_outer",  2, 3, "R",    "PF",  "F",    "2 or 3"},
    {"fsdp2d",                   2, 2, "F",    "F",   "F",    "2"},
    {"fsdp3d",                   3, 3, "F",    "F",   "F",    "3"},
    {"hsdp3",                    3, 3, "RRF",  "PPF", "RRF",  "3"},
    {"hfsdp3",                   3, 3, "RRF",  "PFF", "FFF",  "3"},
    {"zero3_whole",              1, 3, "F",    "W",   "W",    "1, 2 or 3"},
    {"hsdp_whole",               2, 3, "RF",   "PW",  "RW",   "2 or 3"},
    {"hfsdp_whole",              2, 3, "RF",   "PW",  "W",    "2 or 3"},
    /* experts on dp_outer x ep x dp_inner: one expert set per ep coordinate,
       HSDP over the expert-data-parallel groups (docs/semantics.md §4.7) */
    {"ep_experts",               3, 3, "RDF",  "PDF", "RDF",  "3"},
};

#define NTABLE ((int)(sizeof table / sizeof table[0]))

int mf_builtin_count(void) { return NTABLE; }

const char *mf_builtin_name(int i) { return i >= 0 && i < NTABLE ? table[i].name : NULL; }

int mf_builtin_layouts_find(const char *name)
{
    for (int i = 0; name && i < NTABLE; i++)
        if (strcmp(table[i].name, name) == 0)
            return i;
    return -1;
}

bool mf_builtin_layouts_fits(int i, int naxes)
{
    return i >= 0 && i < NTABLE && naxes >= table[i].min_axes && naxes <= table[i].max_axes;
}

const char *mf_builtin_ranks(int i) { return i >= 0 && i < NTABLE ? table[i].ranks : ""; }

static bool expand(const char *pat, int naxes, mf_placement *out)
{
    size_t n = strlen(pat);
    memset(out, 0, sizeof *out);
    if (naxes < 1 || naxes > MF_MAX_AXES)
        return false;
    for (int j = 0; j < naxes; j++) {
        char c = n == 1 ? pat[0] : n == 2 ? pat[j == 0 ? 0 : 1] : pat[j];
        if (n > 2 && n != (size_t)naxes)
            return false;
        out->p[j] = (uint8_t)(c == 'F' || c == MF_WHOLE_LETTER ? MF_PLACE_FLAT
                              : c == 'P'                ? MF_PLACE_PARTIAL
                              : c == MF_DISTINCT_LETTER ? MF_PLACE_DISTINCT
                                                        : MF_PLACE_REPLICATE);
    }
    return true;
}

bool mf_builtin_layouts_resolve(int i, int naxes, mf_dtype dtype[MF_ROLE_COUNT], mf_placement place[MF_ROLE_COUNT])
{
    if (!mf_builtin_layouts_fits(i, naxes))
        return false;
    const mf_builtin *b = &table[i];
    dtype[MF_ROLE_WEIGHT] = MF_BF16;
    dtype[MF_ROLE_GRAD] = MF_FP32;
    dtype[MF_ROLE_MAIN_WEIGHT] = MF_FP32;
    return expand(b->weight, naxes, &place[MF_ROLE_WEIGHT]) && expand(b->grad, naxes, &place[MF_ROLE_GRAD]) &&
           expand(b->main_weight, naxes, &place[MF_ROLE_MAIN_WEIGHT]);
}

void mf_builtin_layouts_whole(int i, bool whole[MF_ROLE_COUNT])
{
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        whole[r] = false;
    if (i < 0 || i >= NTABLE)
        return;
    whole[MF_ROLE_GRAD] = strchr(table[i].grad, MF_WHOLE_LETTER) != NULL;
    whole[MF_ROLE_MAIN_WEIGHT] = strchr(table[i].main_weight, MF_WHOLE_LETTER) != NULL;
}
