/*
 * mf_debug: the check mode (see mf_debug.h). Each tensor view has two
 * regions, its weight and its grad_local, each in one of four states:
 *
 *   LIVE       the real data, no window open (before the first hook, or
 *              for a moment inside a hook)
 *   POISONED   outside its window: the region holds the check pattern and
 *              `saved` the real data; the trainer must not touch it
 *   W_OPEN     a weight inside its window (between forward_pre and
 *              forward_post, or backward_pre and backward_post, of its
 *              unit): `saved` holds a copy taken when the window opened, and
 *              the region must still equal it when the window closes
 *   G_OPEN     a grad_local inside its window (backward_pre .. backward_post):
 *              filled with the pattern when the window opened; at its close
 *              no element may still hold the pattern (not written) or a NaN
 *              carrying its payload (added into, or computed from a poisoned
 *              read)
 *
 * The pattern is a signalling NaN with a payload (fp32 0x7fa5a5a5, bf16
 * 0x7fa5, fp16 0x7d5a): arithmetic on it gives a NaN that keeps the payload,
 * so a read outside a window shows up as NaN in the trainer's results and,
 * through its gradient, at the next backward_post. An fp32 weight's pattern
 * carries its tensor in the low half (0x7fa5 << 16 | tensor + 1), so that
 * backward_post names the weight that was read outside its windows (a tie
 * the spec does not declare, typically), not only the gradient it reached
 * (16-bit patterns have no room for it). Before a hook issues its
 * ops, every poisoned region of a buffer the ops read or write is checked
 * (still the pattern, else the trainer wrote it) and restored; at step_end
 * every poisoned region is checked. Cost: a copy of every weight and
 * grad_local region, and per hook a few passes over the regions of the
 * buckets it moves (docs/runtime.md gives the figure).
 */
#include "mf_debug.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_base.h"
#include "mf_persist.h"

enum { MF_DBG_LIVE, MF_DBG_POISONED, MF_DBG_W_OPEN, MF_DBG_G_OPEN };
enum { MF_DBG_WEIGHT = 0, MF_DBG_GRAD_LOCAL = 1 };

typedef struct mf_dbg_region {
    int view;               /* tensor index */
    int kind;               /* MF_DBG_WEIGHT or MF_DBG_GRAD_LOCAL */
    int unit;
    int buffer;             /* schedule buffer holding it */
    void *p;
    mf_dtype dtype;
    int64_t n;              /* elements */
    size_t bytes;
    void *saved;            /* bytes; owned */
    uint32_t pattern32;     /* the fp32 pattern; a weight's names its tensor */
    int state;
    char since[160];        /* the hook after which it was poisoned */
} mf_dbg_region;

struct mf_debug {
    int nregions;
    mf_dbg_region *regions; /* owned */
};

uint32_t mf_debug_flags(uint32_t flags)
{
    const char *env = getenv("MFSDP_CHECK");
    if (env && *env && strcmp(env, "0") != 0)
        flags |= MFSDP_FLAG_CHECK;
    if (flags & MFSDP_FLAG_CHECK)
        flags |= MFSDP_FLAG_SYNCHRONOUS;
    return flags;
}

/* ---- the pattern ---- */

#define MF_DBG_PATTERN32 0x7fa5a5a5u
#define MF_DBG_PAYLOAD32 0x7fa50000u /* high half of every fp32 pattern */

/* A weight's fp32 pattern names tensor `view` when it fits in the low half. */
static uint32_t pattern_of(int kind, int view)
{
    uint32_t low = (uint32_t)view + 1u;
    return kind == MF_DBG_WEIGHT && low < (MF_DBG_PATTERN32 & 0xffffu) ? MF_DBG_PAYLOAD32 | low : MF_DBG_PATTERN32;
}

/* The tensor whose weight pattern NaN x (fp32, patterned) carries, or -1. */
static int pattern_view(const mf_rt *rt, uint32_t x)
{
    uint32_t low = x & 0xffffu;
    return low >= 1u && low <= (uint32_t)rt->nviews && low < (MF_DBG_PATTERN32 & 0xffffu) ? (int)low - 1 : -1;
}

static void poison(mf_dbg_region *g)
{
    if (g->dtype == MF_FP32) {
        uint32_t *p = g->p;
        for (int64_t i = 0; i < g->n; i++)
            p[i] = g->pattern32;
    } else {
        uint16_t v = g->dtype == MF_BF16 ? 0x7fa5 : 0x7d5a, *p = g->p;
        for (int64_t i = 0; i < g->n; i++)
            p[i] = v;
    }
}

/* 1: exactly the pattern; 2: a NaN with its payload (the sign and the quiet
 * bit aside; fp32 also any low half); 0: anything else. */
static int patterned(const mf_dbg_region *g, int64_t i)
{
    if (g->dtype == MF_FP32) {
        uint32_t x = ((const uint32_t *)g->p)[i];
        if (x == g->pattern32)
            return 1;
        return (x & 0x7fbf0000u) == MF_DBG_PAYLOAD32 ? 2 : 0;
    }
    uint16_t x = ((const uint16_t *)g->p)[i];
    uint16_t pat = g->dtype == MF_BF16 ? 0x7fa5 : 0x7d5a;
    uint16_t quiet = g->dtype == MF_BF16 ? 0x0040 : 0x0200;
    if (x == pat)
        return 1;
    return (x & (uint16_t)~(0x8000u | quiet)) == pat ? 2 : 0;
}

/* ---- create / free ---- */

static int buffer_of(const mf_rt *rt, const void *p)
{
    const mf_schedule *s = rt->s;
    for (int b = 0; b < s->nbuffers; b++) {
        const char *lo = rt->bufs[b];
        size_t bytes = (size_t)mf_persist_held(s, b, rt->rank) * mf_dtype_size(s->buffers[b].dtype);
        if ((const char *)p >= lo && (const char *)p < lo + bytes)
            return b;
    }
    return -1;
}

mfsdp_result mf_debug_create(mf_rt *rt)
{
    if (!(rt->cfg.flags & MFSDP_FLAG_CHECK) || rt->native)
        return MFSDP_OK;
    mf_debug *d = mf_base_calloc(1, sizeof *d);
    if (!d)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (check mode)");
    rt->check = d;
    d->regions = mf_base_calloc((size_t)(2 * rt->nviews + 1), sizeof *d->regions);
    if (!d->regions)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (check mode)");
    for (int k = 0; k < rt->nviews; k++) {
        const mfsdp_tensor_view *v = &rt->views[k];
        for (int kind = 0; kind < 2 && v->numel > 0; kind++) {
            mf_dbg_region *g = &d->regions[d->nregions];
            g->view = k;
            g->kind = kind;
            g->unit = v->unit;
            g->p = kind == MF_DBG_WEIGHT ? v->weight : v->grad_local;
            g->dtype = (mf_dtype)(kind == MF_DBG_WEIGHT ? v->weight_dtype : v->grad_local_dtype);
            g->n = v->numel;
            g->bytes = (size_t)v->numel * mf_dtype_size(g->dtype);
            g->buffer = buffer_of(rt, g->p);
            g->saved = mf_base_malloc(g->bytes);
            g->pattern32 = pattern_of(kind, k);
            g->state = MF_DBG_LIVE;
            if (!g->saved)
                return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY,
                                         "out of memory (check mode: %zu bytes for %s)", g->bytes,
                                         v->name);
            d->nregions++;
        }
    }
    return MFSDP_OK;
}

void mf_debug_free(mf_rt *rt)
{
    mf_debug *d = rt->check;
    if (!d)
        return;
    for (int i = 0; d->regions && i < d->nregions; i++)
        mf_base_free(d->regions[i].saved);
    mf_base_free(d->regions);
    mf_base_free(d);
    rt->check = NULL;
}

/* ---- messages ---- */

static void hook_name(const mf_rt *rt, mf_phase phase, int unit, int64_t m, char *buf, size_t size)
{
    if (phase == MF_PHASE_STEP_BEGIN || phase == MF_PHASE_STEP_END)
        snprintf(buf, size, "mfsdp_%s()", mf_phase_name(phase));
    else
        snprintf(buf, size, "mfsdp_%s(unit %d \"%s\", microbatch %lld)", mf_phase_name(phase),
                 unit, rt->s->units[unit].name, (long long)m);
}

static const char *kind_name(const mf_dbg_region *g)
{
    return g->kind == MF_DBG_WEIGHT ? "weight" : "grad_local";
}

static mfsdp_result mistake(mf_rt *rt, const mf_dbg_region *g, int64_t i, const char *hook,
                            const char *what)
{
    return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                             "check mode: %s: %s of tensor \"%s\" (unit %d \"%s\"), element %lld of "
                             "%lld: %s",
                             hook, kind_name(g), rt->views[g->view].name, g->unit,
                             rt->s->units[g->unit].name, (long long)i, (long long)g->n, what);
}

/* ---- the checks ---- */

/* First element that is no longer the pattern, or -1. */
static int64_t first_unpoisoned(const mf_dbg_region *g)
{
    for (int64_t i = 0; i < g->n; i++)
        if (patterned(g, i) != 1)
            return i;
    return -1;
}

static int64_t first_changed(const mf_dbg_region *g)
{
    size_t es = mf_dtype_size(g->dtype);
    if (memcmp(g->p, g->saved, g->bytes) == 0)
        return -1;
    for (int64_t i = 0; i < g->n; i++)
        if (memcmp((const char *)g->p + (size_t)i * es, (const char *)g->saved + (size_t)i * es,
                   es) != 0)
            return i;
    return -1;
}

static const mf_dbg_region *weight_region(const mf_debug *d, int view)
{
    for (int i = 0; i < d->nregions; i++)
        if (d->regions[i].view == view && d->regions[i].kind == MF_DBG_WEIGHT)
            return &d->regions[i];
    return NULL;
}

/* Whether the compute weight of region w's bucket is replicated on every
 * axis at rest (the `tied` layout's, DDP's): whole on every rank, yet held to
 * its unit's windows. */
static bool replicated_weight(const mf_rt *rt, const mf_dbg_region *w)
{
    if (w->buffer < 0)
        return false;
    const mf_placement *pl = &rt->s->buckets[rt->s->buffers[w->buffer].bucket].place[MF_ROLE_WEIGHT];
    for (int a = 0; a < rt->s->mesh.naxes; a++)
        if (pl->p[a] != MF_PLACE_REPLICATE)
            return false;
    return true;
}

/* grad_local of g holds, at element i, a NaN made from a pattern: names the
 * weight it was made from when the NaN carries one. */
static mfsdp_result pattern_in_grad(mf_rt *rt, const mf_dbg_region *g, int64_t i, const char *hook)
{
    char what[900];
    int view = g->dtype == MF_FP32 ? pattern_view(rt, ((const uint32_t *)g->p)[i]) : -1;
    const mf_dbg_region *w = view >= 0 ? weight_region(rt->check, view) : NULL;
    if (!w)
        return mistake(rt, g, i, hook, "is a NaN made from the check pattern: grad_local was added into instead "
                       "of overwritten, or the gradient was computed from a buffer read outside its window");
    const char *hint = w->unit == g->unit
                           ? "read a weight only between its unit's forward_pre and forward_post, or backward_pre "
                             "and backward_post"
                       : replicated_weight(rt, w)
                           ? "that weight is replicated on every axis (the tied layout), but the check mode holds "
                             "every weight to its own unit's windows: check the model with it untied"
                           : "a weight that another unit reads (a tie, e.g. an LM head reading the embedding) needs "
                             "the tied layout (docs/pytorch.md, \"Tied weights\")";
    snprintf(what, sizeof what,
             "is a NaN made from the check pattern of the weight of tensor \"%s\" (unit %d \"%s\"): the gradient "
             "was computed from a buffer read outside its window (that weight, outside its unit's windows); %s",
             rt->views[view].name, w->unit, rt->s->units[w->unit].name, hint);
    return mistake(rt, g, i, hook, what);
}

/* A closing window's check (weight unchanged, grad_local fully written). */
static mfsdp_result check_close(mf_rt *rt, const mf_dbg_region *g, const char *hook)
{
    char what[320];
    if (g->state == MF_DBG_W_OPEN) {
        int64_t i = first_changed(g);
        if (i >= 0) {
            snprintf(what, sizeof what, "the trainer wrote into the weight since %s; weight is "
                     "read-only (a gradient goes into grad_local)", g->since);
            return mistake(rt, g, i, hook, what);
        }
    } else if (g->state == MF_DBG_G_OPEN) {
        for (int64_t i = 0; i < g->n; i++) {
            int p = patterned(g, i);
            if (p == 1)
                return mistake(rt, g, i, hook, "was not written this microbatch: it still holds "
                               "the check pattern (overwrite every element of grad_local between "
                               "backward_pre and backward_post)");
            if (p == 2)
                return pattern_in_grad(rt, g, i, hook);
        }
    }
    return MFSDP_OK;
}

/* Whether region g must be restored before list l's ops run. */
static bool ops_touch(const mf_rt *rt, int l, int buffer)
{
    for (int k = rt->list_start[l]; k < rt->list_start[l + 1]; k++) {
        const mf_op *op = &rt->s->ops[rt->list_ops[k]];
        if (op->src == buffer || op->dst == buffer)
            return true;
    }
    return false;
}

/* Whether hook (phase, unit) opens (open: its pre hooks) or closes (its post
 * hooks) g's window: a weight's at its unit's forward, backward and
 * evaluation hooks, grad_local's at the backward ones. */
static bool window_edge(const mf_dbg_region *g, mf_phase phase, int unit, bool open)
{
    if (g->unit != unit)
        return false;
    mf_phase backward = open ? MF_PHASE_BACKWARD_PRE : MF_PHASE_BACKWARD_POST;
    if (g->kind != MF_DBG_WEIGHT)
        return phase == backward;
    return phase == backward || phase == (open ? MF_PHASE_FORWARD_PRE : MF_PHASE_FORWARD_POST) ||
           phase == (open ? MF_PHASE_EVAL_PRE : MF_PHASE_EVAL_POST);
}

static bool opens_here(const mf_dbg_region *g, mf_phase phase, int unit)
{
    return window_edge(g, phase, unit, true);
}

static bool closes_here(const mf_dbg_region *g, mf_phase phase, int unit)
{
    return window_edge(g, phase, unit, false);
}

mfsdp_result mf_debug_before(mf_rt *rt, mf_phase phase, int unit, int64_t m, int l)
{
    mf_debug *d = rt->check;
    char hook[160];
    hook_name(rt, phase, unit, m, hook, sizeof hook);
    /* Check everything first: a refused hook changes nothing. */
    for (int i = 0; i < d->nregions; i++) {
        mf_dbg_region *g = &d->regions[i];
        mfsdp_result r = MFSDP_OK;
        if (closes_here(g, phase, unit))
            r = check_close(rt, g, hook);
        bool restore = g->state == MF_DBG_POISONED &&
                       (opens_here(g, phase, unit) || phase == MF_PHASE_STEP_END ||
                        (g->buffer >= 0 && ops_touch(rt, l, g->buffer)));
        if (r == MFSDP_OK && restore) {
            int64_t e = first_unpoisoned(g);
            if (e >= 0) {
                char what[320];
                snprintf(what, sizeof what, "the trainer wrote into it outside its window (it was "
                         "filled with the check pattern after %s)", g->since);
                r = mistake(rt, g, e, hook, what);
            }
        }
        if (r != MFSDP_OK)
            return r;
    }
    for (int i = 0; i < d->nregions; i++) {
        mf_dbg_region *g = &d->regions[i];
        if (closes_here(g, phase, unit) && g->state != MF_DBG_POISONED)
            g->state = MF_DBG_LIVE;
        bool restore = g->state == MF_DBG_POISONED &&
                       (opens_here(g, phase, unit) || (g->buffer >= 0 && ops_touch(rt, l, g->buffer)));
        if (restore) {
            memcpy(g->p, g->saved, g->bytes);
            g->state = MF_DBG_LIVE;
        }
    }
    return MFSDP_OK;
}

void mf_debug_after(mf_rt *rt, mf_phase phase, int unit, int64_t m)
{
    mf_debug *d = rt->check;
    char hook[160];
    hook_name(rt, phase, unit, m, hook, sizeof hook);
    for (int i = 0; i < d->nregions; i++) {
        mf_dbg_region *g = &d->regions[i];
        if (opens_here(g, phase, unit)) {
            if (g->kind == MF_DBG_WEIGHT) {
                memcpy(g->saved, g->p, g->bytes);
                g->state = MF_DBG_W_OPEN;
            } else {
                poison(g);
                g->state = MF_DBG_G_OPEN;
            }
            snprintf(g->since, sizeof g->since, "%s", hook);
        } else if (g->state == MF_DBG_LIVE) {
            memcpy(g->saved, g->p, g->bytes);
            poison(g);
            g->state = MF_DBG_POISONED;
            snprintf(g->since, sizeof g->since, "%s", hook);
        }
    }
}
