/*
 * mf_schedule_summary: the per-step totals of a schedule (mf_summary in
 * mf_schedule.h), derived from its ops, buffers and microbatch count:
 * collective launches and ring bytes per axis, memory per rank by role, and
 * the arena's lower bounds (core/mf_live.h, core/mf_interfere.h). Its own
 * file so that the schedule model does not depend on the bounds, which
 * depend on it. Declared in mf_schedule.h (mf_schedule_summarize).
 */
#include <stdlib.h>
#include <string.h>

#include "mf_interfere.h"
#include "mf_layout.h"
#include "mf_live.h"
#include "mf_persist.h"
#include "mf_schedule.h"

bool mf_schedule_summarize(mf_schedule *s)
{
    mf_summary *sum = &s->summary;
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (!mf_opkind_is_collective(op->kind) || op->axis < 0 || op->axis >= s->mesh.naxes)
            continue;
        int64_t runs = mf_when_runs_per_step(op->when, op->phase, s->microbatches);
        sum->collectives[op->kind][op->axis] += runs;
        sum->bytes[op->axis] +=
            runs * mf_layout_op_bytes(s, op);
    }
    /* Memory per rank by role. Persistent buffers live across steps; step
     * buffers live for the whole step, so they add to the peak in full;
     * microbatch (transient) buffers count at their peak, bounded by the
     * prefetch window (prefetch + 1 units live at once), taking the largest
     * such window per role. */
    size_t nunits = (size_t)(s->nunits > 0 ? s->nunits : 1);
    int64_t *per_unit = calloc(nunits * MF_ROLE_COUNT, sizeof *per_unit);
    if (!per_unit)
        return false;
    int64_t step_bytes[MF_ROLE_COUNT] = {0};
    for (int b = 0; b < s->nbuffers; b++) {
        const mf_buffer *buf = &s->buffers[b];
        mf_role role = mf_bufkind_role(buf->kind);
        int64_t bytes = buf->count * (int64_t)mf_dtype_size(buf->dtype);
        if (buf->lifetime == MF_LIFETIME_PERSISTENT)
            sum->persistent_bytes[role] += bytes;
        else if (buf->lifetime == MF_LIFETIME_STEP)
            step_bytes[role] += bytes;
        else if (buf->bucket >= 0 && buf->bucket < s->nbuckets)
            per_unit[s->buckets[buf->bucket].unit * MF_ROLE_COUNT + role] += bytes;
    }
    if (mf_persist_any_per_rank(s)) {
        /* ragged whole buckets: each rank holds its ranges; per role the
           most over the ranks (docs/semantics.md §4.6) */
        mf_persist_role_most(s, MF_LIFETIME_PERSISTENT, sum->persistent_bytes);
        mf_persist_role_most(s, MF_LIFETIME_STEP, step_bytes);
    }
    /* Sliding sum over windows of prefetch + 1 consecutive units: linear in
     * units whatever the prefetch depth a (loaded) schedule declares. */
    int64_t window = (int64_t)s->prefetch + 1;
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        int64_t transient = 0, w = 0;
        for (int64_t u = 0; u < s->nunits; u++) {
            w += per_unit[u * MF_ROLE_COUNT + r];
            if (u >= window)
                w -= per_unit[(u - window) * MF_ROLE_COUNT + r];
            if (w > transient)
                transient = w;
        }
        sum->model_bytes[r] = sum->persistent_bytes[r] + step_bytes[r] + transient;
    }
    free(per_unit);
    /* The assignment's truth (docs/semantics.md §10): what the runtime
     * allocates, and the live-bytes lower bound any assignment must meet. */
    sum->allocated_bytes = s->mem_persistent + s->mem_transient;
    if (sum->allocated_bytes == 0)
        return true; /* not assigned yet (lowering): no bound to report */
    mf_live lv;
    if (!mf_live_build(s, &lv))
        return false;
    sum->live_bytes = mf_live_lower_bound(s, &lv);
    mf_interfere x = {0};
    bool ok = sum->live_bytes >= 0 && mf_interfere_bound(s, &lv, MF_INTERFERE_WORK, &x);
    if (ok)
        sum->interference_bytes = x.bytes;
    mf_interfere_free(&x);
    mf_live_free(&lv);
    return ok;
}
