/*
 * mf_schedule: names of the closed vocabularies (generated from the X-macro
 * tables), the op table's rows, schedule allocation and the predicates on
 * ops and phases. The per-step summary is core/mf_summary.c's.
 */
#include "mf_schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MF_NAME_ITEM(E, name, ...) name,
static const char *const dtype_names[] = {MF_DTYPE_LIST(MF_NAME_ITEM)};
static const char *const place_names[] = {MF_PLACE_LIST(MF_NAME_ITEM)};
static const char *const role_names[] = {MF_ROLE_LIST(MF_NAME_ITEM)};
static const char *const phase_names[] = {MF_PHASE_LIST(MF_NAME_ITEM)};
static const char *const when_names[] = {MF_WHEN_LIST(MF_NAME_ITEM)};
static const char *const stream_names[] = {MF_STREAM_LIST(MF_NAME_ITEM)};
static const char *const reduce_names[] = {MF_REDUCE_LIST(MF_NAME_ITEM)};
static const char *const lifetime_names[] = {MF_LIFETIME_LIST(MF_NAME_ITEM)};
static const char *const bufkind_names[] = {MF_BUFKIND_LIST(MF_NAME_ITEM)};
static const char *const opkind_names[] = {MF_OPKIND_LIST(MF_NAME_ITEM)};
#undef MF_NAME_ITEM

#define MF_SIZE_ITEM(E, name, size) size,
static const size_t dtype_sizes[] = {MF_DTYPE_LIST(MF_SIZE_ITEM)};
#undef MF_SIZE_ITEM
#define MF_LETTER_ITEM(E, name, letter) letter,
static const char place_letters[] = {MF_PLACE_LIST(MF_LETTER_ITEM)};
#undef MF_LETTER_ITEM
#define MF_ROLE_ITEM(E, name, role) MF_ROLE_##role,
static const mf_role bufkind_roles[] = {MF_BUFKIND_LIST(MF_ROLE_ITEM)};
#undef MF_ROLE_ITEM
#define MF_OPKIND_ROW(E, name, coll, need, becomes, at, stream, doc) \
    {name, coll, MF_PLACE_##need, MF_PLACE_##becomes, MF_OPAT_##at, MF_OPSTREAM_##stream, doc},
static const mf_opkind_info opkind_table[] = {MF_OPKIND_LIST(MF_OPKIND_ROW)};
#undef MF_OPKIND_ROW

#define MF_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *name_of(const char *const *names, int n, int v)
{
    return v >= 0 && v < n ? names[v] : NULL;
}

static int from_name(const char *const *names, int n, const char *s)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(names[i], s) == 0)
            return i;
    return -1;
}

#define MF_NAME_FUNCS(type, table)                                        \
    const char *type##_name(type v) { return name_of(table, MF_COUNT(table), (int)v); } \
    int type##_from_name(const char *s) { return from_name(table, MF_COUNT(table), s); }

MF_NAME_FUNCS(mf_dtype, dtype_names)
/* mf_place: the table's names and Distinct past it (by name only for
 * output: mf_place_from_name reads the table's). */
const char *mf_place_name(mf_place v)
{
    return v == MF_PLACE_DISTINCT ? MF_DISTINCT_NAME : name_of(place_names, MF_COUNT(place_names), (int)v);
}
int mf_place_from_name(const char *s) { return from_name(place_names, MF_COUNT(place_names), s); }
MF_NAME_FUNCS(mf_role, role_names)
MF_NAME_FUNCS(mf_phase, phase_names)
MF_NAME_FUNCS(mf_when, when_names)
MF_NAME_FUNCS(mf_stream, stream_names)
MF_NAME_FUNCS(mf_reduce, reduce_names)
MF_NAME_FUNCS(mf_lifetime, lifetime_names)
MF_NAME_FUNCS(mf_bufkind, bufkind_names)
MF_NAME_FUNCS(mf_opkind, opkind_names)

size_t mf_dtype_size(mf_dtype d)
{
    return (int)d >= 0 && d < MF_DTYPE_COUNT ? dtype_sizes[d] : 0;
}

mf_role mf_bufkind_role(mf_bufkind k)
{
    return bufkind_roles[k];
}

const mf_opkind_info *mf_opkind_info_of(mf_opkind k)
{
    return (int)k >= 0 && k < MF_OPKIND_COUNT ? &opkind_table[k] : NULL;
}

bool mf_opkind_is_collective(mf_opkind k)
{
    const mf_opkind_info *in = mf_opkind_info_of(k);
    return in && in->collective;
}

bool mf_opkind_on_axis(mf_opkind k)
{
    const mf_opkind_info *in = mf_opkind_info_of(k);
    return in && in->at != MF_OPAT_NO_AXIS;
}

int mf_opkind_for_move(mf_place a, mf_place b)
{
    for (int k = 0; k < MF_OPKIND_COUNT; k++)
        if (opkind_table[k].at != MF_OPAT_NO_AXIS && opkind_table[k].need == (int)a &&
            opkind_table[k].becomes == (int)b)
            return k;
    return -1;
}

mf_stream mf_axis_stream(int naxes, int axis)
{
    return axis == naxes - 1 ? MF_STREAM_INNER : MF_STREAM_OUTER;
}

char mf_place_letter(mf_place p)
{
    if (p == MF_PLACE_DISTINCT)
        return MF_DISTINCT_LETTER;
    return (int)p >= 0 && p < MF_PLACE_COUNT ? place_letters[p] : '?';
}

mf_schedule *mf_schedule_new(void)
{
    mf_schedule *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->arena = mf_arena_create();
    if (!s->arena) {
        free(s);
        return NULL;
    }
    s->microbatches = 1;
    s->align = 256;
    s->prefetch = 1;
    return s;
}

void mf_schedule_free(mf_schedule *s)
{
    if (!s)
        return;
    mf_arena_destroy(s->arena);
    free(s);
}

int64_t mf_schedule_collective_bytes(mf_opkind k, int64_t n, int64_t count, mf_dtype d)
{
    int64_t size = (int64_t)mf_dtype_size(d);
    if (n <= 1)
        return 0;
    switch (k) {
    case MF_OP_ALL_GATHER:
    case MF_OP_REDUCE_SCATTER:
        return (n - 1) * count * size;
    case MF_OP_ALL_REDUCE:
        return 2 * (n - 1) * ((count + n - 1) / n) * size;
    default:
        return 0;
    }
}

bool mf_when_holds(mf_when w, unsigned pos)
{
    if (w == MF_WHEN_SHORT || (pos & MF_POS_SHORT))
        return w == MF_WHEN_SHORT && (pos & MF_POS_SHORT);
    return w == MF_WHEN_EVERY || (w == MF_WHEN_FIRST && (pos & MF_POS_FIRST)) ||
           (w == MF_WHEN_LAST && (pos & MF_POS_LAST));
}

int mf_schedule_replay_runs(const mf_schedule *s, int runs[MF_REPLAY_RUNS_MAX])
{
    int full = s->microbatches >= 3 ? 3 : (int)s->microbatches, n = 0;
    if (!s->programs) {
        runs[n++] = full;
        runs[n++] = full;
        return n;
    }
    /* every boundary: full->full, full->eval, eval->eval, eval->short,
     * short->short, short->full, eval->full */
    runs[n++] = full;
    runs[n++] = full;
    runs[n++] = 0;
    runs[n++] = 0;
    for (int m = 1; m < full; m++)
        runs[n++] = m;
    runs[n++] = full;
    runs[n++] = 0;
    runs[n++] = full;
    return n;
}

bool mf_op_is_data(const mf_op *op)
{
    return op->kind != MF_OP_RECORD && op->kind != MF_OP_WAIT;
}

bool mf_phase_is_step(mf_phase phase)
{
    return phase == MF_PHASE_STEP_BEGIN || phase == MF_PHASE_STEP_END;
}

bool mf_phase_is_eval(mf_phase phase)
{
    return phase == MF_PHASE_EVAL_PRE || phase == MF_PHASE_EVAL_POST;
}

bool mf_op_in_step(const mf_op *op)
{
    return !mf_phase_is_eval(op->phase) && op->when != MF_WHEN_SHORT;
}

int64_t mf_when_runs_per_step(mf_when when, mf_phase phase, int64_t microbatches)
{
    if (mf_phase_is_eval(phase) || when == MF_WHEN_SHORT)
        return 0;
    if (mf_phase_is_step(phase))
        return 1;
    return when == MF_WHEN_EVERY ? microbatches : 1;
}

bool mf_placement_equal(const mf_placement *a, const mf_placement *b, int naxes)
{
    for (int j = 0; j < naxes; j++)
        if (a->p[j] != b->p[j])
            return false;
    return true;
}

bool mf_placement_has_distinct(const mf_placement *p, int naxes)
{
    for (int j = 0; j < naxes; j++)
        if (p->p[j] == MF_PLACE_DISTINCT)
            return true;
    return false;
}

mf_placement mf_placement_uniform(mf_place fill, const mf_placement *keep, int naxes)
{
    mf_placement out;
    memset(&out, 0, sizeof out);
    for (int j = 0; j < naxes; j++)
        out.p[j] = (uint8_t)(keep && keep->p[j] == MF_PLACE_DISTINCT ? MF_PLACE_DISTINCT : fill);
    return out;
}

const char *mf_role_place_name(const mf_placement *p, int j, bool whole)
{
    return whole && p->p[j] == MF_PLACE_FLAT ? MF_WHOLE_NAME : mf_place_name((mf_place)p->p[j]);
}

char *mf_placement_format(const mf_placement *p, int naxes, char *buf, size_t size)
{
    return mf_placement_format_as(p, naxes, false, buf, size);
}

char *mf_placement_format_as(const mf_placement *p, int naxes, bool whole, char *buf, size_t size)
{
    size_t at = 0;
    int n = snprintf(buf, size, "[");
    at = n > 0 ? (size_t)n : 0;
    for (int j = 0; j < naxes && at < size; j++) {
        n = snprintf(buf + at, size - at, "%s%s", j ? ", " : "", mf_role_place_name(p, j, whole));
        if (n > 0)
            at += (size_t)n;
    }
    if (at < size)
        snprintf(buf + at, size - at, "]");
    return buf;
}

char *mf_placement_letters(const mf_placement *p, int naxes, char *buf)
{
    int j;
    for (j = 0; j < naxes; j++)
        buf[j] = mf_place_letter((mf_place)p->p[j]);
    buf[j] = '\0';
    return buf;
}
