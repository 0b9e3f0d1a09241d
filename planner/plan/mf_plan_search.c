/*
 * mf_plan_search: candidates, their evaluation through the compiler's own
 * passes, and the exact Pareto front (see mf_plan_search.h, docs/plan.md §3).
 */
#include "mf_plan_search.h"

#include <stdlib.h>
#include <string.h>

#include "mf_assign.h"
#include "mf_hash.h"
#include "mf_ast.h"
#include "mf_interfere.h"
#include "mf_builtin_layouts.h"
#include "mf_passes.h"
#include "mf_layout.h"
#include "mf_limits.h"
#include "mf_plan_muon.h"
#include "mf_plan_owners.h"
#include "mf_plan_stats.h"
#include "mf_plan_tbound.h"
#include "mf_free.h"


/* Figures computed per laid-out schedule (see "candidates with the same
 * buckets" below). */
typedef struct ps_memo {
    int stage;              /* 1: lb_mem known; 2: also the step time before the assignment; 3: the point */
    bool lowered_bound;     /* lb_mem is the lowered schedule's (live_mem_bound) */
    double lb_mem;          /* a lower bound of the peak: from the buckets (layout_mem_bounds), then
                               from the lowered schedule's live bytes */
    double lb_planned;      /* the bound from the buckets alone (kept for the tests) */
    double t1;              /* a lower bound of the step time from the planned buckets
                               (mf_ps_planned_time_bound) */
    double t0;              /* the step time simulated before the buffer assignment */
    mf_ps_point point;      /* figures only (choice, index not used) */
    bool group_done;        /* an entry of a layout group (its key's prefetch is 0): */
    double gmem[3], gtime[3]; /* its bounds per prefetch depth (ps_group_bounds) */
} ps_memo;

static const int64_t bucket_ladder[] = {0, INT64_C(16) << 20, INT64_C(64) << 20};

static bool same_layout(const mf_spec_layout *a, const mf_spec_layout *b, int naxes)
{
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (a->dtype[r] != b->dtype[r] || a->whole[r] != b->whole[r] ||
            !mf_placement_equal(&a->place[r], &b->place[r], naxes))
            return false;
    return true;
}

static bool weight_sharded(const mf_spec_layout *l, int naxes)
{
    for (int j = 0; j < naxes; j++)
        if (l->place[MF_ROLE_WEIGHT].p[j] != MF_PLACE_REPLICATE)
            return true;
    return false;
}

/* The spec's layouts followed by every built-in layout that fits the mesh
 * and has no Distinct axis (a `layout auto` unit's tensors are the same
 * tensor on every rank: plan never adds or drops a Distinct axis),
 * those equal to an earlier built-in one left out, those whose name a
 * declared layout of other content shadows left out. *nsearch receives the
 * built-in indices searched, in table order. */
static int build_layouts(mf_plan_search *ps, int *search, int *nsearch)
{
    const mf_spec *b = ps->base;
    int naxes = b->mesh.naxes, n = b->nlayouts;
    mf_spec_layout *ls = calloc((size_t)(n + mf_builtin_count()), sizeof *ls);
    if (!ls)
        return -1;
    memcpy(ls, b->layouts, (size_t)n * sizeof *ls);
    *nsearch = 0;
    for (int i = 0; i < mf_builtin_count(); i++) {
        mf_spec_layout l = {.name = mf_builtin_name(i)};
        if (!mf_builtin_layouts_resolve(i, naxes, l.dtype, l.place))
            continue;
        mf_builtin_layouts_whole(i, l.whole);
        if (!ps->opt.muon && (l.whole[MF_ROLE_GRAD] || l.whole[MF_ROLE_MAIN_WEIGHT]))
            continue; /* Whole pays padding for an optimizer step only muon models */
        if (mf_placement_has_distinct(&l.place[MF_ROLE_WEIGHT], naxes))
            continue; /* Distinct says what a tensor is, not how to shard it: never chosen */
        int idx = -1;
        bool shadowed = false, dup = false;
        for (int k = 0; k < n; k++)
            if (!ls[k].is_inline && strcmp(ls[k].name, l.name) == 0) {
                idx = k;
                shadowed = !same_layout(&ls[k], &l, naxes);
            }
        for (int k = 0; k < *nsearch; k++)
            dup = dup || same_layout(&ls[search[k]], &l, naxes);
        if (shadowed || dup)
            continue;
        if (idx < 0) {
            ls[n] = l;
            idx = n++;
        }
        search[(*nsearch)++] = idx;
    }
    ps->spec.layouts = ls;
    ps->spec.nlayouts = n;
    return 0;
}

static bool has_option(const mf_ast_unit *u)
{
    for (const mf_ast_item *it = u->body; it; it = it->next)
        if (it->kind == MF_AST_ITEM_OPTION)
            return true;
    return false;
}

/* One group per unit declaration; its choices. */
static int build_groups(mf_plan_search *ps, const mf_ast *ast, const int *search, int nsearch)
{
    int ng = 0, u = 0, naxes = ps->base->mesh.naxes;
    for (const mf_ast_unit *d = ast->units; d; d = d->next)
        ng++;
    ps->groups = calloc((size_t)ng, sizeof *ps->groups);
    if (!ps->groups)
        return -1;
    ps->ngroups = ng;
    int g = 0;
    for (const mf_ast_unit *d = ast->units; d; d = d->next, g++) {
        mf_ps_group *gr = &ps->groups[g];
        int iters = d->loop ? (int)(d->loop->hi.value - d->loop->lo.value) : 1;
        const mf_spec_unit *su = &ps->base->units[u];
        gr->name = d->name.text;
        gr->first_unit = u;
        gr->nunits = iters;
        gr->is_auto = su->layout_auto;
        gr->reshard_set = has_option(d);
        u += iters;
        gr->choices = calloc((size_t)(2 * nsearch + 1), sizeof *gr->choices);
        if (!gr->choices)
            return -1;
        if (!gr->is_auto) {
            gr->choices[gr->nchoices++] = (mf_ps_choice){su->layout, -1, su->reshard_after_forward};
            continue;
        }
        for (int k = 0; k < nsearch; k++) {
            const mf_spec_layout *l = &ps->spec.layouts[search[k]];
            int bi = mf_builtin_layouts_find(l->name);
            if (gr->reshard_set || !weight_sharded(l, naxes)) {
                gr->choices[gr->nchoices++] = (mf_ps_choice){search[k], bi, su->reshard_after_forward};
            } else {
                gr->choices[gr->nchoices++] = (mf_ps_choice){search[k], bi, true};
                gr->choices[gr->nchoices++] = (mf_ps_choice){search[k], bi, false};
            }
        }
    }
    if (u != ps->base->nunits) {
        snprintf(ps->err, sizeof ps->err, "internal error: the unit declarations expand to %d units, the spec has %d",
                 u, ps->base->nunits);
        return -2;
    }
    return 0;
}

/* The unit's tensors with every run of consecutive tensors of one layout
 * class (the unit's default layout, or one override layout) fused into one
 * tensor of their summed elements, named after the first, when every tensor
 * of the run but the last has a multiple of 16 elements. The layout pass
 * (mf_layout_pass.c) packs a bucket's tensors in declaration order, each
 * offset rounded up to the tensor quantum, which divides 16 for every dtype,
 * so such a run occupies the same span and ends at the same element whether
 * fused or not, in whichever bucket its class lands; the buckets, their
 * lengths, the units they cover and the elements per unit, hence every
 * figure of the candidate, are the same, for a fraction of the tensors
 * (DeepSeek-MoE's ~200 tensors per unit become 3). A run whose sum would
 * overflow is not fused. Returns the count, or -1 on OOM (*out malloc'ed). */
static int fuse_tensors(const mf_spec_unit *su, mf_spec_tensor **out)
{
    mf_spec_tensor *ft = malloc(((size_t)su->ntensors + 1) * sizeof *ft);
    if (!ft)
        return -1;
    int n = 0;
    for (int t = 0; t < su->ntensors; t++) {
        const mf_spec_tensor *x = &su->tensors[t];
        mf_spec_tensor *last = n > 0 ? &ft[n - 1] : NULL;
        int64_t sum;
        if (last && last->unit_default == x->unit_default && (x->unit_default || last->layout == x->layout) &&
            last->numel % 16 == 0 && !__builtin_add_overflow(last->numel, x->numel, &sum)) {
            last->numel = sum;
            last->dims[0] = sum;
            continue;
        }
        ft[n] = *x;
        ft[n].ndims = 1;
        ft[n].dims[0] = x->numel;
        n++;
    }
    *out = ft;
    return n;
}

/* The unit's tensors as they are (*out malloc'ed); the count or -1 on OOM. */
static int copy_tensors(const mf_spec_unit *su, mf_spec_tensor **out)
{
    *out = malloc(((size_t)su->ntensors + 1) * sizeof **out);
    if (!*out)
        return -1;
    memcpy(*out, su->tensors, (size_t)su->ntensors * sizeof **out);
    return su->ntensors;
}

static bool ast_sets(const mf_ast *ast, mf_ast_setting_kind k)
{
    for (const mf_ast_setting *s = ast->settings; s; s = s->next)
        if (s->kind == k)
            return true;
    return false;
}

static int compute_times(mf_plan_search *ps);

int mf_plan_search_init(mf_plan_search *ps, const mf_spec *base, const mf_ast *ast, const mf_ps_options *opt)
{
    memset(ps, 0, sizeof *ps);
    ps->base = base;
    ps->spec = *base;
    ps->opt = *opt;
    ps->opt.adamw = NULL;
    ps->opt.nadamw = 0;
    int search[32], nsearch = 0, rc = -1;
    if (opt->muon && !opt->muon_all && (ps->opt.nadamw = mf_plan_muon_adamw(base, &ps->opt.adamw)) < 0)
        goto oom;
    ps->spec.units = calloc((size_t)base->nunits, sizeof *ps->spec.units);
    if (!ps->spec.units || build_layouts(ps, search, &nsearch) != 0)
        goto oom;
    memcpy(ps->spec.units, base->units, (size_t)base->nunits * sizeof *ps->spec.units);
    for (int u = 0; u < base->nunits; u++)
        ps->spec.units[u].tensors = NULL; /* owned from here on (mf_plan_search_free) */
    for (int u = 0; u < base->nunits; u++) {
        mf_spec_unit *su = &ps->spec.units[u];
        mf_spec_tensor *ft;
        /* muon: no fusion, which would merge the tensors a Whole layout
           packs one by one and whose shapes its optimizer model reads */
        int n = opt->muon ? copy_tensors(&base->units[u], &ft) : fuse_tensors(&base->units[u], &ft);
        if (n < 0)
            goto oom;
        su->tensors = ft;
        su->ntensors = n;
        su->layout_auto = false;
    }
    rc = build_groups(ps, ast, search, nsearch);
    if (rc == -1)
        goto oom;
    if (rc != 0)
        return -1;
    if (ast_sets(ast, MF_AST_SET_PREFETCH))
        ps->prefetch[ps->nprefetch++] = base->prefetch;
    else
        for (int p = 1; p <= 3; p++)
            ps->prefetch[ps->nprefetch++] = p;
    if (ast_sets(ast, MF_AST_SET_BUCKET_SIZE))
        ps->bucket[ps->nbucket++] = base->bucket_size;
    else
        for (size_t k = 0; k < sizeof bucket_ladder / sizeof bucket_ladder[0]; k++)
            ps->bucket[ps->nbucket++] = bucket_ladder[k];
    /* Refused before any work when it could not finish in the documented
     * time (docs/plan.md): the limit is on candidates, what the search's
     * time and memory grow with. */
    int64_t limit = opt->exhaustive ? MF_LIMIT_PLAN_EXHAUSTIVE : MF_LIMIT_PLAN_CANDIDATES;
    int64_t n = (int64_t)ps->nprefetch * ps->nbucket;
    for (int g = 0; g < ps->ngroups; g++) {
        if (n > limit / ps->groups[g].nchoices) {
            snprintf(ps->err, sizeof ps->err,
                     "the search space is too large: more than %lld candidates%s (%d auto unit "
                     "declarations, %d prefetch depths x %d bucket sizes); narrow it: declare repeated "
                     "units with a loop ('unit \"layers.{i}\" for i in 0..N layout auto'), which share "
                     "one choice, fix the layouts of some units, or set prefetch and bucket_size",
                     (long long)limit, opt->exhaustive ? " for --exhaustive" : "", ps->ngroups,
                     ps->nprefetch, ps->nbucket);
            return -1;
        }
        n *= ps->groups[g].nchoices;
    }
    ps->ncandidates = n;
    mf_vec_init(&ps->memo, sizeof(ps_memo));
    ps->tcache = mf_transition_cache_new();
    ps->layout_canon = malloc((size_t)(ps->spec.nlayouts + 1) * sizeof *ps->layout_canon);
    if (!ps->tcache || !ps->layout_canon || mf_plan_search_bounds_prepare(ps) != 0)
        goto oom;
    ps->layout_canon[0] = -1; /* filled by the first layout pass */
    return compute_times(ps);
oom:
    snprintf(ps->err, sizeof ps->err, "out of memory");
    return -1;
}

void mf_plan_search_free(mf_plan_search *ps)
{
    free(ps->opt.adamw);
    for (int u = 0; ps->spec.units && u < ps->base->nunits; u++)
        free(ps->spec.units[u].tensors);
    free(ps->spec.units);
    free(ps->spec.layouts);
    for (int g = 0; ps->groups && g < ps->ngroups; g++) {
        mf_ps_group *gr = &ps->groups[g];
        MF_FREE_ALL(gr->choices, gr->lb_persistent, gr->lb_wf, gr->lb_gl, gr->lb_bytes, gr->lb_fixed,
                    gr->lb_head, gr->lb_tail, gr->lb_drain, gr->lb_t2, gr->lb_fifo);
    }
    MF_FREE_ALL(ps->groups, ps->fwd, ps->bwd, ps->lb_scratch, ps->lb_fifo_of, ps->lb_items);
    if (ps->sink)
        fclose(ps->sink);
    mf_transition_cache_free(ps->tcache);
    mf_vec_free(&ps->memo);
    mf_hash_free(&ps->memo_index);
    free(ps->memo_key);
    free(ps->layout_canon);
    for (int i = 0; i < ps->nfront; i++)
        free(ps->front[i].choice);
    free(ps->front);
    memset(ps, 0, sizeof *ps);
}

const char *mf_plan_search_layout_name(const mf_plan_search *ps, int g, int c)
{
    return ps->spec.layouts[ps->groups[g].choices[c].layout].name;
}

static bool front_dominates(const mf_plan_search *ps, double lb_mem, double lb_time);

/* Writes the candidate into ps->spec. */
static void apply(mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice)
{
    ps->spec.prefetch = prefetch;
    ps->spec.bucket_size = bucket;
    for (int g = 0; g < ps->ngroups; g++) {
        const mf_ps_group *gr = &ps->groups[g];
        const mf_ps_choice *ch = &gr->choices[choice[g]];
        for (int u = gr->first_unit; u < gr->first_unit + gr->nunits; u++) {
            mf_spec_unit *su = &ps->spec.units[u];
            su->layout = ch->layout;
            su->reshard_after_forward = ch->reshard;
            if (gr->is_auto)
                for (int t = 0; t < su->ntensors; t++)
                    if (su->tensors[t].unit_default)
                        su->tensors[t].layout = ch->layout;
        }
    }
}

/* A plan of the candidate, not laid out yet, quiet (its text is never
 * printed), sharing the search's transition cache; NULL on OOM. */
static mf_plan *candidate_plan(mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice)
{
    apply(ps, prefetch, bucket, choice);
    if (!ps->sink)
        ps->sink = fopen("/dev/null", "w");
    mf_plan *p = ps->sink ? mf_plan_new(&ps->spec, &ps->opt.sim.cost) : NULL;
    if (!p)
        return NULL;
    p->quiet = true; /* candidates are measured, never printed */
    p->lazy_summary = true; /* summarized only when finished (finish_point) */
    p->tcache = ps->tcache;
    p->layout_canon = ps->layout_canon;
    return p;
}

/* The compute times, the same for every candidate (they depend on the
 * tensors only): the simulator's own function on the first candidate's
 * layout, then passed to it explicitly (ps->fwd, ps->bwd), and their sum
 * over the step in the simulator's issue order (ps->compute_time, for the
 * bounds). 0, or -1 with ps->err. */
static int compute_times(mf_plan_search *ps)
{
    int *choice = calloc((size_t)ps->ngroups + 1, sizeof *choice);
    mf_plan *p = choice ? candidate_plan(ps, ps->prefetch[0], ps->bucket[0], choice) : NULL;
    mf_diag d;
    mf_diag_init(&d, NULL, ps->sink);
    int rc = -1;
    if (!p)
        goto oom;
    if (!mf_layout_pass_run(p, &d)) {
        snprintf(ps->err, sizeof ps->err, "internal error: a candidate does not compile");
        goto done;
    }
    int U = p->sched->nunits;
    ps->fwd = calloc((size_t)U + 1, sizeof *ps->fwd);
    ps->bwd = calloc((size_t)U + 1, sizeof *ps->bwd);
    if (!ps->fwd || !ps->bwd)
        goto oom;
    for (int u = 0; u < U; u++)
        mf_simulate_unit_times(p->sched, &ps->opt.sim, u, &ps->fwd[u], &ps->bwd[u]);
    ps->compute_time = 0;
    for (int64_t m = 0; m < p->sched->microbatches; m++) {
        for (int u = 0; u < U; u++)
            ps->compute_time += ps->fwd[u];
        for (int u = U - 1; u >= 0; u--)
            ps->compute_time += ps->bwd[u];
    }
    rc = 0;
done:
    mf_plan_free(p);
    free(choice);
    return rc;
oom:
    snprintf(ps->err, sizeof ps->err, "out of memory");
    goto done;
}

int mf_plan_search_evaluate(mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice, mf_ps_point *pt)
{
    return mf_plan_search_evaluate_pruned(ps, prefetch, bucket, choice, -1, NULL, pt);
}

/* ---- candidates with the same buckets ----
 *
 * Different candidates often lay out to the same buckets (e.g. two
 * bucket_size values that merge the same units, or choices that differ
 * only where no tensor uses them). Everything after the layout pass reads
 * of the spec only what the schedule it wrote holds (the transition pass,
 * the memory figure, the lowering, the assignment and the simulator read
 * the schedule; the spec only for names in diagnostics), and the compute
 * times are fixed per search (ps->fwd), so two candidates with equal
 * schedules after the layout pass -- the header fields a search varies
 * (prefetch), every unit's reshard_after_forward and every bucket's
 * dtypes, placements, padded length and units -- have equal figures. The
 * search keeps, per such schedule, the figures already computed: the peak,
 * the step time before the assignment, and the exact point; a later
 * candidate with the same schedule takes them instead of running the passes
 * again. Keys are the full bytes (no digest), so equal keys mean equal
 * schedules. */

/* Room for a key of n bytes in ps->memo_key; NULL on OOM. */
static uint8_t *memo_key_room(mf_plan_search *ps, size_t n)
{
    if (n > ps->memo_key_cap) {
        uint8_t *k = realloc(ps->memo_key, n);
        if (!k)
            return NULL;
        ps->memo_key = k;
        ps->memo_key_cap = n;
    }
    return ps->memo_key;
}

/* The memo entry of the plan's laid-out schedule (created at stage 0),
 * or NULL on OOM. */
static ps_memo *memo_of(mf_plan_search *ps, const mf_schedule *s)
{
    size_t n = 0, need = 1 + (size_t)s->nunits + (size_t)s->nbuckets * (MF_ROLE_COUNT * (2 + MF_MAX_AXES) + 16);
    uint8_t *key = memo_key_room(ps, need);
    if (!key || ps->memo.len >= INT32_MAX - 1)
        return NULL;
    key[n++] = (uint8_t)s->prefetch;
    for (int u = 0; u < s->nunits; u++)
        key[n++] = s->units[u].reshard_after_forward;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            key[n++] = (uint8_t)bk->dtype[r];
            key[n++] = bk->whole[r]; /* with the same buckets before it, the same packing */
            for (int j = 0; j < s->mesh.naxes; j++)
                key[n++] = bk->place[r].p[j];
        }
        int32_t range[2] = {bk->unit, bk->last_unit};
        memcpy(key + n, &bk->length, sizeof bk->length);
        memcpy(key + n + sizeof bk->length, range, sizeof range);
        n += sizeof bk->length + sizeof range;
    }
    int64_t next = (int64_t)ps->memo.len;
    int64_t at = mf_hash_get_or_put(&ps->memo_index, key, n, next);
    if (at < 0)
        return NULL;
    if (at < next) {
        ps->reused++;
        return (ps_memo *)ps->memo.data + at;
    }
    ps_memo *m = mf_vec_push(&ps->memo);
    if (!m)
        return NULL;
    memset(m, 0, sizeof *m);
    return m;
}

static bool beats(const mf_ps_point *a, const mf_ps_point *b);

double mf_plan_search_optimizer_seconds(const mf_ps_options *opt, const mf_schedule *s)
{
    return opt->muon ? mf_plan_owners_muon_seconds(s, &opt->sim.cost, opt->optimizer_flops, opt->adamw, opt->nadamw)
                     : 0;
}

static double optimizer_seconds_of(const void *opt, const mf_schedule *s)
{
    return mf_plan_search_optimizer_seconds(opt, s);
}

int mf_plan_search_planned_time_bounds(const mf_plan_search *ps, const struct mf_plan *p, const int *prefetch, int n,
                                       double *out)
{
    mf_plan_tbound_in in = {.fwd = ps->fwd, .bwd = ps->bwd, .sim = &ps->opt.sim,
                            .optimizer_seconds = optimizer_seconds_of, .ctx = &ps->opt};
    return mf_plan_tbound_time_bounds(&in, p, prefetch, n, out);
}

/* The figures of a point that a simulation gives (time_only included). */
static void sim_figures(const mf_plan_search *ps, const mf_schedule *s, const mf_sim_result *res, mf_ps_point *pt)
{
    pt->optimizer_time = mf_plan_search_optimizer_seconds(&ps->opt, s);
    pt->step_time = res->step_time + pt->optimizer_time;
    pt->outer_bytes = 0;
    int naxes = ps->spec.mesh.naxes;
    for (int j = 0; j < MF_MAX_AXES; j++) {
        pt->bytes[j] = j < naxes ? res->bytes[j] : 0;
        if (j < naxes - 1)
            pt->outer_bytes += res->bytes[j];
    }
}

/* Whether a front point beats x (front_insert would then drop x). */
static bool front_beats(const mf_plan_search *ps, const mf_ps_point *x)
{
    for (int i = 0; i < ps->nfront; i++)
        if (beats(&ps->front[i], x))
            return true;
    return false;
}

/* The exact point of a lowered plan: its summary (lazy_summary), buffer
 * assignment (with the live intervals lv, their live-bytes bound `live` and
 * the interference bound when built already, else NULL and -1), peak,
 * simulation. With `cand` (the candidate's index), the
 * step time and bytes come first from a time-only simulation (the same
 * figures: mf_sim_config.time_only), and when a front point beats that
 * point, front_insert would drop it: returns 1 with only pt->mem and
 * pt->step_time set,
 * without the full simulation (critical path, exposed spans) the front's
 * overlap figures need. 0 with *pt filled, or -1 with ps->err. */
static int finish_point(mf_plan_search *ps, mf_plan *p, mf_diag *d, const mf_sim_config *cfg,
                        const mf_live *lv, int64_t live, int64_t interference, const mf_ps_point *cand,
                        mf_ps_point *pt)
{
    mf_sim_result res = {0};
    char err[256];
    int rc = -1;
    if (!mf_lower_summarize(p, d)) {
        snprintf(ps->err, sizeof ps->err, "internal error: a candidate's lowered totals differ from its plan's");
        goto done;
    }
    /* the buffer assignment adds the waits buffer reuse needs, which the
       simulator honours: run it as the compiler does (mf_pipeline.c) */
    if (!(lv ? mf_assign_run_live(p->sched, lv, live, interference, NULL) : mf_assign_run(p->sched, NULL))) {
        snprintf(ps->err, sizeof ps->err, "out of memory");
        goto done;
    }
    /* the peak: what the runtime allocates plus the optimizer state, by the
       function explain and simulate call (mf_plan_mem.h) */
    mf_plan_mem_of(p->sched, ps->opt.optimizer_bytes, &pt->mem);
    if (cand) {
        mf_sim_config quick = *cfg;
        quick.time_only = true;
        mf_sim_result qr;
        if (mf_simulate(p->sched, &quick, &qr, err, sizeof err) != 0) {
            snprintf(ps->err, sizeof ps->err, "cannot simulate a candidate: %s", err);
            goto done;
        }
        mf_ps_point x = *cand;
        x.mem = pt->mem;
        sim_figures(ps, p->sched, &qr, &x);
        mf_sim_result_free(&qr);
        if (front_beats(ps, &x)) {
            pt->step_time = x.step_time;
            ps->evaluated++;
            rc = 1;
            goto done;
        }
    }
    if (mf_simulate(p->sched, cfg, &res, err, sizeof err) != 0) {
        snprintf(ps->err, sizeof ps->err, "cannot simulate a candidate: %s", err);
        goto done;
    }
    sim_figures(ps, p->sched, &res, pt);
    pt->overlap = res.overlap;
    pt->comm_exposed = res.comm_exposed;
    ps->evaluated++;
    rc = 0;
done:
    mf_sim_result_free(&res);
    return rc;
}

/* The step time of the lowered plan before the buffer assignment. The
 * assignment only inserts waits and zero-time records, so every item of the
 * simulation starts no earlier with them (docs/plan.md §3): a lower bound
 * of the candidate's step time. 0, or -1 with ps->err. */
static int step_before_assignment(mf_plan_search *ps, mf_plan *p, const mf_sim_config *cfg, double *t0)
{
    mf_sim_result res = {0};
    mf_sim_config quick = *cfg;
    quick.time_only = true;
    char err[256];
    if (mf_simulate(p->sched, &quick, &res, err, sizeof err) != 0) {
        snprintf(ps->err, sizeof ps->err, "cannot simulate a candidate: %s", err);
        return -1;
    }
    *t0 = res.step_time + mf_plan_search_optimizer_seconds(&ps->opt, p->sched); /* as sim_figures adds it */
    mf_sim_result_free(&res);
    return 0;
}

/* Lower bounds of the peak of a planned spec (layout and transitions; the
 * lowering need not run), from its buckets, one per prefetch depth in
 * prefetch[0..n) (the plan's own is not read) into out[]: the persistent
 * buffers of every bucket and the optimizer state as the lowering sizes
 * them (before the rounding to `align`, which only adds), plus the arena
 * bound over the buckets and their transitions' stage buffers
 * (mf_plan_search_arena_bound, mf_plan_bound.c), the only part that depends on the
 * prefetch depth. 0, or -1 on OOM. */
/* Bytes of bucket bk's persistent buffers (main_weight, weight, grad,
 * grad_final) on rank r: the ranges r holds (mf_layout_bucket_range), which
 * are the buffers' counts unless the bucket is ragged. */
static double bucket_persistent_on(const mf_schedule *s, const mf_bucket *bk, int64_t r)
{
    const mf_placement *W = &bk->place[MF_ROLE_WEIGHT], *G = &bk->place[MF_ROLE_GRAD],
                       *O = &bk->place[MF_ROLE_MAIN_WEIGHT];
    double o = (double)mf_layout_bucket_range(&s->mesh, bk, O, r).len;
    double b = o * (double)mf_dtype_size(bk->dtype[MF_ROLE_MAIN_WEIGHT]) +
               (double)mf_layout_bucket_range(&s->mesh, bk, W, r).len * (double)mf_dtype_size(bk->dtype[MF_ROLE_WEIGHT]) +
               (double)mf_layout_bucket_range(&s->mesh, bk, G, r).len * (double)mf_dtype_size(bk->dtype[MF_ROLE_GRAD]);
    if (!mf_placement_equal(G, O, s->mesh.naxes))
        b += o * (double)mf_dtype_size(bk->dtype[MF_ROLE_GRAD]);
    return b;
}

/* The persistent buffers of every bucket as the lowering sizes them, the
 * most over the ranks: with ragged (whole) buckets each rank holds only
 * its ranges there (core/mf_persist.h), so the buckets' longest shards
 * would overstate it. */
static double persistent_bound(const mf_schedule *s)
{
    bool ragged = false;
    double shared = 0; /* the buckets of equal shards: the same on every rank */
    for (int b = 0; b < s->nbuckets; b++) {
        ragged = ragged || s->buckets[b].bounds;
        if (!s->buckets[b].bounds)
            shared += bucket_persistent_on(s, &s->buckets[b], 0);
    }
    double most = 0;
    for (int64_t r = 0; ragged && r < s->mesh.world; r++) {
        double sum = 0;
        for (int b = 0; b < s->nbuckets; b++)
            if (s->buckets[b].bounds)
                sum += bucket_persistent_on(s, &s->buckets[b], r);
        most = sum > most ? sum : most;
    }
    return shared + most;
}

static int layout_mem_bounds(const mf_plan_search *ps, const mf_plan *p, const int *prefetch, int n, double *out)
{
    const mf_schedule *s = p->sched;
    mf_ps_live_item *items = malloc(sizeof *items * ((size_t)s->nbuckets + 1));
    double *scratch = malloc(sizeof *scratch * (2 * (size_t)s->nunits + 1));
    double pers = persistent_bound(s);
    int rc = -1;
    if (!items || !scratch)
        goto done;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        mf_bucket_memory bm;
        mf_bucket_memory_of(p, b, &bm);
        items[b] = (mf_ps_live_item){bk->unit, bk->last_unit, (double)bm.weight_full, (double)bm.grad_local,
                                     !s->units[bk->unit].reshard_after_forward, 0, 0};
        /* stage buffers as mf_lower.c makes them: one per step output but
           the last, T2's in the weight dtype (only when W is not Replicate:
           weight_full exists), T3's in the grad dtype */
        const mf_transition *t2 = &p->trans[b][MF_T2], *t3 = &p->trans[b][MF_T3];
        for (int i = 0; bm.weight_full > 0 && i + 1 < t2->nsteps; i++)
            if (t2->steps[i + 1].stream != MF_STREAM_COMPUTE)
                items[b].t2_stage += (double)mf_layout_bucket_capacity(&s->mesh, bk, &t2->steps[i].to) *
                                     (double)mf_dtype_size(bk->dtype[MF_ROLE_WEIGHT]);
        for (int i = 0; i + 1 < t3->nsteps; i++)
            if (t3->steps[i + 1].stream != MF_STREAM_COMPUTE)
                items[b].t3_after += (double)mf_layout_bucket_capacity(&s->mesh, bk, &t3->steps[i].to) *
                                     (double)mf_dtype_size(bk->dtype[MF_ROLE_GRAD]);
        if (t3->nsteps > 0 && t3->steps[0].stream != MF_STREAM_COMPUTE)
            items[b].t3_after += (double)bm.grad_local;
    }
    double opt = (double)mf_plan_mem_optimizer_bytes(s, ps->opt.optimizer_bytes);
    for (int i = 0; i < n; i++)
        out[i] = (pers + mf_plan_search_arena_bound(s->nunits, prefetch[i], items, s->nbuckets, scratch) + opt) *
                 (1 - 1e-9);
    rc = 0;
done:
    free(items);
    free(scratch);
    return rc;
}

/* A tighter lower bound of the peak once the plan is lowered: the
 * persistent region exactly as the assignment lays it out, the live-bytes
 * bound of the arena (the most transient bytes live at one tick, below every
 * packing, docs/semantics.md §10) and the optimizer state. Builds *lv (the
 * caller frees it) and *live for the assignment. -1 on OOM. */
static double live_mem_bound(const mf_plan_search *ps, const mf_schedule *s, mf_live *lv, int64_t *live)
{
    if (!mf_live_build(s, lv))
        return -1;
    *live = mf_live_lower_bound(s, lv);
    if (*live < 0)
        return -1;
    return ((double)mf_assign_persistent_bytes(s) + (double)*live +
            (double)mf_plan_mem_optimizer_bytes(s, ps->opt.optimizer_bytes)) * (1 - 1e-9);
}

/* Runs the transition pass (unless it ran) and the lowering on a plan laid
 * out, once; false when a pass failed. */
static bool lower_once(mf_plan *p, mf_diag *d, bool *lowered)
{
    if (*lowered)
        return true;
    if (!p->trans && !mf_transition_run(p, d))
        return false;
    *lowered = mf_lower_run(p, d);
    return *lowered;
}

/* One candidate under evaluation: the plan, its memo entry, and what the
 * lowering left for the buffer assignment. The steps below answer EV_GO
 * (go on), EV_PRUNED (a front point dominates its bounds: return 1) or an
 * error, EV_FAIL with ps->err set, EV_OOM or EV_BROKEN. */
typedef struct ps_eval {
    mf_plan_search *ps;
    int prefetch;
    int64_t bucket;
    mf_sim_config cfg;
    mf_plan *p;
    mf_diag d;
    ps_memo *m;
    bool lowered, have_lv;
    mf_live lv;             /* built with the live-bytes bound */
    int64_t live, interference; /* -1 until computed */
} ps_eval;

enum { EV_GO, EV_PRUNED, EV_FAIL, EV_OOM, EV_BROKEN };

/* Stage 1 of the memo: the memory bound from the buckets (planned: the
 * caller's bounds, already computed). */
static int eval_layout_bound(ps_eval *e, const double *planned)
{
    ps_memo *m = e->m;
    if (m->stage < 1 && planned) {
        m->lb_mem = m->lb_planned = planned[0];
        m->t1 = planned[1];
        m->stage = 1;
    }
    if (m->stage < 1) {
        if (!mf_transition_run(e->p, &e->d))
            return EV_BROKEN;
        if (layout_mem_bounds(e->ps, e->p, &e->prefetch, 1, &m->lb_mem) != 0)
            return EV_OOM;
        m->lb_planned = m->lb_mem;
        m->t1 = -1; /* computed when needed */
        m->stage = 1;
    }
    return EV_GO;
}

/* Memory bound and time bound dominated: not lowered; first with the time
 * bound from the spec, then with the one from the planned buckets (which
 * raises *lb_time). */
static int eval_planned_bounds(ps_eval *e, double *lb_time, mf_ps_point *pt)
{
    ps_memo *m = e->m;
    bool dominated = *lb_time >= 0 && front_dominates(e->ps, m->lb_mem, *lb_time);
    if (!dominated && m->t1 < 0) {
        if (!e->p->trans && !mf_transition_run(e->p, &e->d))
            return EV_BROKEN;
        if (mf_plan_search_planned_time_bounds(e->ps, e->p, &e->prefetch, 1, &m->t1) != 0)
            return EV_OOM;
    }
    pt->lb_planned_time = m->t1 > 0 ? m->t1 : 0;
    if (!dominated && *lb_time >= 0 && m->t1 > *lb_time) {
        *lb_time = m->t1;
        dominated = front_dominates(e->ps, m->lb_mem, *lb_time);
    }
    if (dominated) {
        e->ps->memory_only++;
        return EV_PRUNED;
    }
    return EV_GO;
}

/* Raises the memo's memory bound to lb; EV_PRUNED when the front then
 * dominates (lb_mem, tb). */
static int eval_raise_mem_bound(ps_eval *e, double lb, double tb)
{
    e->m->lb_mem = lb > e->m->lb_mem ? lb : e->m->lb_mem;
    if (front_dominates(e->ps, e->m->lb_mem, tb)) {
        e->ps->sim_pruned++;
        return EV_PRUNED;
    }
    return EV_GO;
}

/* The bounds of the lowered plan: the step time before the assignment
 * (stage 2), then, once per schedule, the live-bytes bound (tighter than the
 * buckets') and the interference bound (the heaviest set of buffers that
 * must be disjoint, >= the live bytes; the assignment needs it anyway). */
static int eval_lowered_bounds(ps_eval *e, double lb_time)
{
    ps_memo *m = e->m;
    if (m->stage < 2) {
        if (!lower_once(e->p, &e->d, &e->lowered))
            return EV_BROKEN;
        if (step_before_assignment(e->ps, e->p, &e->cfg, &m->t0) != 0)
            return EV_FAIL;
        m->stage = 2;
    }
    double tb = m->t0 > lb_time ? m->t0 : lb_time;
    int ev = eval_raise_mem_bound(e, m->lb_mem, tb);
    if (ev != EV_GO || m->lowered_bound)
        return ev;
    if (!lower_once(e->p, &e->d, &e->lowered))
        return EV_BROKEN;
    double lb = live_mem_bound(e->ps, e->p->sched, &e->lv, &e->live);
    if (lb < 0)
        return EV_OOM;
    e->have_lv = true;
    m->lowered_bound = true;
    if ((ev = eval_raise_mem_bound(e, lb, tb)) != EV_GO)
        return ev;
    mf_interfere x;
    if (!mf_interfere_bound(e->p->sched, &e->lv, MF_INTERFERE_WORK, &x))
        return EV_OOM;
    e->interference = x.bytes;
    mf_interfere_free(&x);
    double ib = ((double)mf_assign_persistent_bytes(e->p->sched) + (double)e->interference +
                 (double)mf_plan_mem_optimizer_bytes(e->p->sched, e->ps->opt.optimizer_bytes)) * (1 - 1e-9);
    return eval_raise_mem_bound(e, ib, tb);
}

/* Stage 3: the exact point (finish_point), unless the front beats its
 * time-only figures (cand: the candidate, when pruning). */
static int eval_exact_point(ps_eval *e, const mf_ps_point *cand)
{
    ps_memo *m = e->m;
    if (m->stage >= 3)
        return EV_GO;
    if (!lower_once(e->p, &e->d, &e->lowered))
        return EV_BROKEN;
    int fr = finish_point(e->ps, e->p, &e->d, &e->cfg, e->have_lv ? &e->lv : NULL, e->live, e->interference, cand,
                          &m->point);
    if (fr < 0)
        return EV_FAIL;
    if (fr == 1) {
        /* beaten by the front, which only gets better: the exact peak
           and step time are kept as this schedule's bounds (stage 2) */
        m->lb_mem = (double)m->point.mem.peak;
        m->t0 = m->point.step_time;
        e->ps->sim_pruned++;
        return EV_PRUNED;
    }
    m->stage = 3;
    return EV_GO;
}

/* The steps of mf_plan_search_evaluate_pruned up to the exact point in the memo. */
static int eval_steps(ps_eval *e, double lb_time, const double *planned, mf_ps_point *pt)
{
    if (!e->p)
        return EV_OOM;
    if (!mf_layout_pass_run(e->p, &e->d))
        return EV_BROKEN;
    if (!(e->m = memo_of(e->ps, e->p->sched)))
        return EV_OOM;
    int ev = eval_layout_bound(e, planned);
    if (ev != EV_GO)
        return ev;
    pt->prefetch = e->prefetch;
    pt->bucket_size = e->bucket;
    pt->lb_planned = e->m->lb_planned;
    if ((ev = eval_planned_bounds(e, &lb_time, pt)) != EV_GO)
        return ev;
    if (lb_time >= 0 && (ev = eval_lowered_bounds(e, lb_time)) != EV_GO)
        return ev;
    return eval_exact_point(e, lb_time >= 0 ? pt : NULL);
}

int mf_plan_search_evaluate_pruned(mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice, double lb_time,
                                   const double *planned, mf_ps_point *pt)
{
    ps_eval e = {.ps = ps, .prefetch = prefetch, .bucket = bucket, .cfg = ps->opt.sim, .live = -1,
                 .interference = -1};
    e.cfg.fwd_time = ps->fwd;
    e.cfg.bwd_time = ps->bwd;
    e.p = candidate_plan(ps, prefetch, bucket, choice);
    mf_diag_init(&e.d, NULL, ps->sink);
    int ev = eval_steps(&e, lb_time, planned, pt);
    if (ev == EV_GO) {
        const mf_ps_point *x = &e.m->point;
        pt->mem = x->mem;
        pt->step_time = x->step_time;
        pt->optimizer_time = x->optimizer_time;
        pt->overlap = x->overlap;
        pt->comm_exposed = x->comm_exposed;
        pt->outer_bytes = x->outer_bytes;
        memcpy(pt->bytes, x->bytes, sizeof pt->bytes);
    } else if (ev == EV_OOM) {
        snprintf(ps->err, sizeof ps->err, "out of memory");
    } else if (ev == EV_BROKEN) {
        snprintf(ps->err, sizeof ps->err,
                 "internal error: a candidate (prefetch %d, bucket_size %lld) does not compile", prefetch,
                 (long long)bucket);
    }
    if (e.have_lv)
        mf_live_free(&e.lv);
    mf_plan_free(e.p);
    return ev == EV_GO ? 0 : ev == EV_PRUNED ? 1 : -1;
}

/* ---- the front ---- */

/* a before b for equal memory and step time: fewer outer bytes, then earlier. */
static bool tie_better(const mf_ps_point *a, const mf_ps_point *b)
{
    return a->outer_bytes != b->outer_bytes ? a->outer_bytes < b->outer_bytes : a->index < b->index;
}

/* a dominates b, or is the same point and wins the tie. */
static bool beats(const mf_ps_point *a, const mf_ps_point *b)
{
    if (a->mem.peak > b->mem.peak || a->step_time > b->step_time)
        return false;
    if (a->mem.peak < b->mem.peak || a->step_time < b->step_time)
        return true;
    return tie_better(a, b);
}

/* Inserts a copy of *x (its choice copied) unless a front point beats it;
 * removes the points it beats. 0, or -1 on OOM. */
static int front_insert(mf_plan_search *ps, const mf_ps_point *x)
{
    for (int i = 0; i < ps->nfront; i++)
        if (beats(&ps->front[i], x))
            return 0;
    int k = 0;
    for (int i = 0; i < ps->nfront; i++) {
        if (beats(x, &ps->front[i]))
            free(ps->front[i].choice);
        else
            ps->front[k++] = ps->front[i];
    }
    ps->nfront = k;
    mf_ps_point *nf = realloc(ps->front, (size_t)(k + 1) * sizeof *nf);
    int *ch = malloc((size_t)(ps->ngroups ? ps->ngroups : 1) * sizeof *ch);
    if (!nf || !ch) {
        if (nf)
            ps->front = nf;
        free(ch);
        return -1;
    }
    ps->front = nf;
    int at = k;
    while (at > 0 && (nf[at - 1].mem.peak > x->mem.peak ||
                      (nf[at - 1].mem.peak == x->mem.peak && nf[at - 1].step_time > x->step_time)))
        at--;
    memmove(nf + at + 1, nf + at, (size_t)(k - at) * sizeof *nf);
    nf[at] = *x;
    memcpy(ch, x->choice, (size_t)ps->ngroups * sizeof *ch);
    nf[at].choice = ch;
    ps->nfront = k + 1;
    return 0;
}

/* Whether a front point is at most (lb_mem, lb_time) with one strictly less:
 * then it dominates every candidate with those lower bounds. The front is
 * sorted by memory with step time falling, so the last point with memory <=
 * lb_mem has the least step time among them. */
static bool front_dominates(const mf_plan_search *ps, double lb_mem, double lb_time)
{
    const mf_ps_point *best = NULL;
    for (int i = 0; i < ps->nfront && (double)ps->front[i].mem.peak <= lb_mem; i++)
        best = &ps->front[i];
    return best && best->step_time <= lb_time &&
           ((double)best->mem.peak < lb_mem || best->step_time < lb_time);
}

/* Decodes candidate index into settings and choices. */
static void decode(const mf_plan_search *ps, int64_t idx, int *prefetch, int64_t *bucket, int *choice)
{
    for (int g = ps->ngroups - 1; g >= 0; g--) {
        choice[g] = (int)(idx % ps->groups[g].nchoices);
        idx /= ps->groups[g].nchoices;
    }
    *bucket = ps->bucket[idx % ps->nbucket];
    idx /= ps->nbucket;
    *prefetch = ps->prefetch[idx];
}

typedef struct cand {
    double lb_mem, lb_time;
    int64_t index;
} cand;

/* The bits of a non-negative double, which order as the doubles do. */
static uint64_t key_bits(double v)
{
    uint64_t k;
    if (!(v > 0))
        v = 0;
    memcpy(&k, &v, sizeof k);
    return k;
}

/* Sorts cs[0..n) by (lb_mem, lb_time, index), given in index order: a
 * stable least-significant-digit radix sort, 16 bits a pass, lb_time's
 * passes then lb_mem's (qsort's comparisons were a twentieth of the search
 * on DeepSeek-MoE's 368 640 candidates). false on OOM. */
static bool sort_candidates(cand *cs, int64_t n)
{
    cand *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    size_t *count = malloc(65537 * sizeof *count);
    if (!tmp || !count) {
        free(tmp);
        free(count);
        return false;
    }
    cand *from = cs, *to = tmp;
    for (int pass = 0; pass < 8; pass++) {
        int shift = 16 * (pass % 4);
        bool mem = pass >= 4;
        memset(count, 0, 65537 * sizeof *count);
        for (int64_t i = 0; i < n; i++)
            count[((key_bits(mem ? from[i].lb_mem : from[i].lb_time) >> shift) & 0xffff) + 1]++;
        for (int d = 0; d < 65536; d++)
            count[d + 1] += count[d];
        for (int64_t i = 0; i < n; i++)
            to[count[(key_bits(mem ? from[i].lb_mem : from[i].lb_time) >> shift) & 0xffff]++] = from[i];
        cand *sw = from;
        from = to;
        to = sw;
    }
    /* eight passes: the result is back in cs */
    free(tmp);
    free(count);
    return true;
}

/* ---- bounds per layout group ----
 *
 * The prefetch depth is read by no pass before the lowering (the layout
 * and transition passes do not look at it), so the candidates that differ
 * only in it -- a layout group: the candidate index modulo the candidates
 * per prefetch value -- lay out to the same buckets and transitions. Their
 * bounds from the planned buckets (memory: layout_mem_bounds, time:
 * mf_ps_planned_time_bound) are computed together, from one layout, the
 * first time any of them is visited; a candidate those bounds and the front
 * dominate is skipped without a layout of its own. The visiting order
 * (by memory bound) is unchanged, so this only saves passes. */

typedef struct ps_group_bounds {
    bool done;
    double mem[3], time[3]; /* per prefetch value (ps->prefetch order) */
} ps_group_bounds;

/* the most layout groups whose bounds are kept (48 MB) */
#define MF_PS_MAX_GROUP_BOUNDS (INT64_C(1) << 20)

static int group_bounds(mf_plan_search *ps, int64_t lg, int *choice, ps_group_bounds *gb)
{
    int prefetch;
    int64_t bucket;
    decode(ps, lg, &prefetch, &bucket, choice); /* lg < per-prefetch count: prefetch index 0 */
    mf_plan *p = candidate_plan(ps, prefetch, bucket, choice);
    mf_diag d;
    mf_diag_init(&d, NULL, ps->sink);
    int rc = -1;
    if (!p) {
        snprintf(ps->err, sizeof ps->err, "out of memory");
        goto done;
    }
    if (!mf_layout_pass_run(p, &d)) {
        snprintf(ps->err, sizeof ps->err,
                 "internal error: a candidate (bucket_size %lld) does not compile", (long long)bucket);
        goto done;
    }
    /* groups that lay out alike (e.g. two bucket sizes that merge the same
       units) have the same bounds: kept in the memo under the schedule's
       key with prefetch 0, which no candidate has */
    p->sched->prefetch = 0;
    ps_memo *m = memo_of(ps, p->sched);
    if (!m) {
        snprintf(ps->err, sizeof ps->err, "out of memory");
        goto done;
    }
    if (m->group_done) {
        memcpy(gb->mem, m->gmem, sizeof gb->mem);
        memcpy(gb->time, m->gtime, sizeof gb->time);
        gb->done = true;
        rc = 0;
        goto done;
    }
    if (!mf_transition_run(p, &d)) {
        snprintf(ps->err, sizeof ps->err,
                 "internal error: a candidate (bucket_size %lld) does not compile", (long long)bucket);
        goto done;
    }
    if (mf_plan_search_planned_time_bounds(ps, p, ps->prefetch, ps->nprefetch, gb->time) != 0 ||
        layout_mem_bounds(ps, p, ps->prefetch, ps->nprefetch, gb->mem) != 0) {
        snprintf(ps->err, sizeof ps->err, "out of memory");
        goto done;
    }
    memcpy(m->gmem, gb->mem, sizeof gb->mem);
    memcpy(m->gtime, gb->time, sizeof gb->time);
    m->group_done = true;
    gb->done = true;
    rc = 0;
done:
    mf_plan_free(p);
    return rc;
}

static int eval_insert(mf_plan_search *ps, int64_t idx, double lb_time, const double *planned, int *choice)
{
    mf_ps_point pt = {.index = idx, .choice = choice};
    int prefetch;
    int64_t bucket;
    decode(ps, idx, &prefetch, &bucket, choice);
    int rc = mf_plan_search_evaluate_pruned(ps, prefetch, bucket, choice, lb_time, planned, &pt);
    if (rc != 0)
        return rc == 1 ? 0 : -1;
    if (front_insert(ps, &pt) != 0) {
        snprintf(ps->err, sizeof ps->err, "out of memory");
        return -1;
    }
    return 0;
}

int mf_plan_search_run(mf_plan_search *ps)
{
    int *choice = malloc((size_t)(ps->ngroups ? ps->ngroups : 1) * sizeof *choice);
    cand *cs = NULL;
    ps_group_bounds *gbs = NULL;
    int rc = -1;
    if (!choice)
        goto oom;
    if (ps->opt.exhaustive) {
        for (int64_t i = 0; i < ps->ncandidates; i++)
            if (eval_insert(ps, i, -1, NULL, choice) != 0)
                goto done;
        rc = 0;
        goto done;
    }
    cs = malloc((size_t)ps->ncandidates * sizeof *cs);
    if (!cs)
        goto oom;
    for (int64_t i = 0; i < ps->ncandidates; i++) {
        int prefetch;
        int64_t bucket;
        decode(ps, i, &prefetch, &bucket, choice);
        cs[i].index = i;
        mf_plan_search_lower_bounds(ps, prefetch, bucket, choice, &cs[i].lb_mem, &cs[i].lb_time);
    }
    if (!sort_candidates(cs, ps->ncandidates))
        goto oom;
    int64_t per_prefetch = ps->ncandidates / ps->nprefetch;
    if (per_prefetch <= MF_PS_MAX_GROUP_BOUNDS && !(gbs = calloc((size_t)per_prefetch, sizeof *gbs)))
        goto oom;
    for (int64_t i = 0; i < ps->ncandidates; i++) {
        if (front_dominates(ps, cs[i].lb_mem, cs[i].lb_time))
            continue;
        double planned[2], *known = NULL;
        if (gbs) {
            int64_t lg = cs[i].index % per_prefetch;
            int pi = (int)(cs[i].index / per_prefetch);
            if (!gbs[lg].done && group_bounds(ps, lg, choice, &gbs[lg]) != 0)
                goto done;
            planned[0] = gbs[lg].mem[pi];
            planned[1] = gbs[lg].time[pi];
            known = planned;
            if (front_dominates(ps, planned[0], planned[1] > cs[i].lb_time ? planned[1] : cs[i].lb_time)) {
                ps->memory_only++;
                continue;
            }
        }
        if (eval_insert(ps, cs[i].index, cs[i].lb_time, known, choice) != 0)
            goto done;
    }
    rc = 0;
    goto done;
oom:
    snprintf(ps->err, sizeof ps->err, "out of memory");
done:
    free(gbs);
    free(cs);
    free(choice);
    return rc;
}

const mf_ps_point *mf_plan_search_choose(const mf_plan_search *ps, int64_t budget)
{
    const mf_ps_point *best = NULL;
    for (int i = 0; i < ps->nfront; i++) {
        const mf_ps_point *p = &ps->front[i];
        if (p->mem.peak <= budget && (!best || p->step_time < best->step_time))
            best = p;
    }
    return best;
}
