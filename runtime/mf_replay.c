/*
 * mf_replay: the replay engine's host side. At create it sorts the schedule's
 * ops into one list per (phase, unit, microbatch class) -- the class says
 * which `when` predicates hold (first, last, both, neither) -- so a hook is a
 * table lookup and a loop, with no allocation and no search. At each hook it
 * checks the call against the schedule's order, issues the list's ops in
 * ascending id (record: next sequence number of its event; wait: the latest
 * issued one) and advances the expected hook.
 *
 * The order (docs/runtime.md §4): step_begin; per microbatch m, forward_pre/post for
 * units 0..U-1, then backward_pre/post for units U-1..0; step_end. A hook out
 * of order is refused with the expected hook named; nothing is issued and the
 * state does not move, so the trainer can still make the right call.
 */
#include <stdio.h>
#include <string.h>

#include "mf_debug.h"
#include "mf_rt.h"

static int mb_class(const mf_schedule *s, int64_t m)
{
    if (m < 0)
        return MF_MB_ONLY;      /* step_begin / step_end: once per step */
    return (m == 0 ? MF_MB_FIRST : 0) | (m == s->microbatches - 1 ? MF_MB_LAST : 0);
}

static bool when_holds(mf_when w, int cls)
{
    switch (w) {
    case MF_WHEN_FIRST:
        return (cls & MF_MB_FIRST) != 0;
    case MF_WHEN_LAST:
        return (cls & MF_MB_LAST) != 0;
    default:
        return true;
    }
}

static int list_index(const mf_schedule *s, mf_phase phase, int unit, int cls)
{
    int slot = unit < 0 ? s->nunits : unit;
    return (((int)phase * (s->nunits + 1)) + slot) * MF_MB_CLASSES + cls;
}

int mf_replay_list(const mf_rt *rt, mf_phase phase, int unit, int64_t microbatch)
{
    return list_index(rt->s, phase, unit, mb_class(rt->s, microbatch));
}

mfsdp_result mf_replay_build_lists(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    rt->nlists = MF_PHASE_COUNT * (s->nunits + 1) * MF_MB_CLASSES;
    rt->list_start = mf_rt_calloc((size_t)rt->nlists + 1, sizeof *rt->list_start);
    if (!rt->list_start)
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (op lists)");
    /* Two passes: count per list, then fill in ascending op id. */
    int total = 0;
    for (int i = 0; i < s->nops; i++)
        for (int c = 0; c < MF_MB_CLASSES; c++)
            if (when_holds(s->ops[i].when, c)) {
                rt->list_start[list_index(s, s->ops[i].phase, s->ops[i].unit, c) + 1]++;
                total++;
            }
    for (int l = 0; l < rt->nlists; l++)
        rt->list_start[l + 1] += rt->list_start[l];
    rt->list_ops = mf_rt_calloc((size_t)(total ? total : 1), sizeof *rt->list_ops);
    int *fill = mf_rt_calloc((size_t)rt->nlists, sizeof *fill);
    if (!rt->list_ops || !fill) {
        mf_rt_free(fill);
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (op lists)");
    }
    for (int i = 0; i < s->nops; i++)
        for (int c = 0; c < MF_MB_CLASSES; c++)
            if (when_holds(s->ops[i].when, c)) {
                int l = list_index(s, s->ops[i].phase, s->ops[i].unit, c);
                rt->list_ops[rt->list_start[l] + fill[l]++] = i;
            }
    mf_rt_free(fill);
    return MFSDP_OK;
}

int64_t mf_replay_stream_ops_per_step(const mf_rt *rt, mf_stream st)
{
    const mf_schedule *s = rt->s;
    int64_t n = 0;
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].stream == st)
            n += mf_when_runs_per_step(s->ops[i].when, s->ops[i].phase, s->microbatches);
    return n;
}

/* ---- the hook order ---- */

static void advance(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    int U = s->nunits;
    switch (rt->next_phase) {
    case MF_PHASE_STEP_BEGIN:
        rt->next_mb = 0;
        if (U == 0) {
            rt->next_phase = MF_PHASE_STEP_END;
            rt->next_unit = -1;
        } else {
            rt->next_phase = MF_PHASE_FORWARD_PRE;
            rt->next_unit = 0;
        }
        break;
    case MF_PHASE_FORWARD_PRE:
        rt->next_phase = MF_PHASE_FORWARD_POST;
        break;
    case MF_PHASE_FORWARD_POST:
        if (rt->next_unit + 1 < U) {
            rt->next_phase = MF_PHASE_FORWARD_PRE;
            rt->next_unit++;
        } else {
            rt->next_phase = MF_PHASE_BACKWARD_PRE;
        }
        break;
    case MF_PHASE_BACKWARD_PRE:
        rt->next_phase = MF_PHASE_BACKWARD_POST;
        break;
    case MF_PHASE_BACKWARD_POST:
        if (rt->next_unit > 0) {
            rt->next_phase = MF_PHASE_BACKWARD_PRE;
            rt->next_unit--;
        } else if (rt->next_mb + 1 < s->microbatches) {
            rt->next_phase = MF_PHASE_FORWARD_PRE;
            rt->next_mb++;
        } else {
            rt->next_phase = MF_PHASE_STEP_END;
            rt->next_unit = -1;
        }
        break;
    default:
        rt->next_phase = MF_PHASE_STEP_BEGIN;
        rt->next_unit = -1;
        rt->next_mb = 0;
        break;
    }
}

/* "mfsdp_forward_pre(unit 2 \"layers.1\", microbatch 0)" */
static void describe_hook(const mf_rt *rt, mf_phase phase, int unit, int64_t m, char *buf,
                          size_t size)
{
    if (phase == MF_PHASE_STEP_BEGIN || phase == MF_PHASE_STEP_END) {
        snprintf(buf, size, "mfsdp_%s()", mf_phase_name(phase));
        return;
    }
    const char *name = unit >= 0 && unit < rt->s->nunits ? rt->s->units[unit].name : "?";
    snprintf(buf, size, "mfsdp_%s(unit %d \"%s\", microbatch %lld)", mf_phase_name(phase), unit,
             name, (long long)m);
}

/* Issues one op (all execution models). */
static mfsdp_result issue(mf_rt *rt, int i, int64_t m, int64_t *compute_wait_ns)
{
    const mf_schedule *s = rt->s;
    const mf_op *op = &s->ops[i];
    int64_t seq = 0;
    if (op->kind == MF_OP_RECORD)
        seq = ++rt->ev_issued[op->event];
    else if (op->kind == MF_OP_WAIT)
        seq = rt->ev_issued[op->event];
    rt->stats.ops++;
    if (mf_opkind_is_collective(op->kind)) {
        rt->stats.collectives[op->axis]++;
        rt->stats.bytes[op->axis] +=
            mf_collective_bytes(op->kind, s->mesh.axes[op->axis].size, op->count, op->dtype);
    }
    if (rt->native) {
        char msg[MF_RT_ERRLEN];
        msg[0] = '\0';
        mfsdp_result r = rt->be->submit(rt, &rt->rops[i], m, seq, msg, sizeof msg);
        if (r != MFSDP_OK)
            mf_rt_fail(rt, r, msg);
        return r;
    }
    if (rt->synchronous) {
        mf_rt_entry e = {.op = i, .microbatch = m, .seq = seq};
        char msg[MF_RT_ERRLEN];
        msg[0] = '\0';
        mfsdp_result r = mf_streams_exec(rt, op->stream, &e, msg, sizeof msg, compute_wait_ns);
        if (r != MFSDP_OK)
            mf_rt_fail(rt, r, msg);
        return r;
    }
    return mf_streams_issue(rt, i, m, seq, compute_wait_ns);
}

/* Returns the sticky failure (copied into rt->err), or MFSDP_OK. */
static mfsdp_result sticky(mf_rt *rt)
{
    pthread_mutex_lock(&rt->mu);
    mfsdp_result r = rt->failed;
    if (r != MFSDP_OK)
        snprintf(rt->err, sizeof rt->err, "%s", rt->fail_msg);
    pthread_mutex_unlock(&rt->mu);
    return r;
}

mfsdp_result mf_replay_hook(mf_rt *rt, mf_phase phase, int unit, int64_t m)
{
    if (!mf_rt_live(rt)) {
        char fn[48];
        snprintf(fn, sizeof fn, "mfsdp_%s", mf_phase_name(phase));
        return mf_rt_handle_check(rt, fn);
    }
    const mf_schedule *s = rt->s;
    mfsdp_result res = sticky(rt);
    if (res != MFSDP_OK)
        return res;
    bool per_unit = phase != MF_PHASE_STEP_BEGIN && phase != MF_PHASE_STEP_END;
    if (per_unit && (unit < 0 || unit >= s->nunits))
        return mf_rt_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                               "mfsdp_%s: unit %d is out of range (the schedule has %d units)",
                               mf_phase_name(phase), unit, s->nunits);
    if (per_unit && (m < 0 || m >= s->microbatches))
        return mf_rt_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                               "mfsdp_%s: microbatch %lld is out of range (the schedule has %lld)",
                               mf_phase_name(phase), (long long)m, (long long)s->microbatches);
    if (!per_unit) {
        unit = -1;
        m = -1;
    }
    bool expected = phase == rt->next_phase &&
                    (!per_unit || (unit == rt->next_unit && m == rt->next_mb));
    if (!expected) {
        char got[160], want[160];
        describe_hook(rt, phase, unit, m, got, sizeof got);
        describe_hook(rt, rt->next_phase, rt->next_unit, rt->next_mb, want, sizeof want);
        return mf_rt_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                               "%s called out of order: the schedule expects %s next", got, want);
    }

    int l = mf_replay_list(rt, phase, unit, m);
    if (rt->check && (res = mf_debug_before(rt, phase, unit, m, l)) != MFSDP_OK)
        return res;
    int64_t t0 = mf_rt_now_ns(), wait_ns = 0;
    for (int k = rt->list_start[l]; k < rt->list_start[l + 1]; k++) {
        res = issue(rt, rt->list_ops[k], m, &wait_ns);
        if (res != MFSDP_OK)
            break;
    }
    if (!rt->native && !rt->synchronous)
        mf_streams_kick(rt);    /* the hook's entries were queued without waking anyone */
    advance(rt);
    if (rt->check && res == MFSDP_OK)
        mf_debug_after(rt, phase, unit, m);
    if (res == MFSDP_OK && phase == MF_PHASE_STEP_END && !rt->native && !rt->synchronous)
        res = mf_streams_drain(rt);
    int64_t t1 = mf_rt_now_ns();
    pthread_mutex_lock(&rt->mu);
    rt->stats.busy_ns[MF_STREAM_COMPUTE] += (t1 - t0) - wait_ns;
    rt->stats.wait_ns[MF_STREAM_COMPUTE] += wait_ns;
    if (phase == MF_PHASE_STEP_END && res == MFSDP_OK)
        rt->stats.steps++;
    pthread_mutex_unlock(&rt->mu);
    /* A native backend's watchdog fails the runtime from its own thread: a
     * hook whose ops all enqueued must still report that. */
    if (res != MFSDP_OK || rt->native) {
        mfsdp_result f = sticky(rt);
        return f != MFSDP_OK ? f : res;
    }
    return MFSDP_OK;
}

MFSDP_API mfsdp_result mfsdp_step_begin(mfsdp_runtime *rt)
{
    return mf_replay_hook(rt, MF_PHASE_STEP_BEGIN, -1, -1);
}

MFSDP_API mfsdp_result mfsdp_forward_pre(mfsdp_runtime *rt, int unit, int64_t microbatch)
{
    return mf_replay_hook(rt, MF_PHASE_FORWARD_PRE, unit, microbatch);
}

MFSDP_API mfsdp_result mfsdp_forward_post(mfsdp_runtime *rt, int unit, int64_t microbatch)
{
    return mf_replay_hook(rt, MF_PHASE_FORWARD_POST, unit, microbatch);
}

MFSDP_API mfsdp_result mfsdp_backward_pre(mfsdp_runtime *rt, int unit, int64_t microbatch)
{
    return mf_replay_hook(rt, MF_PHASE_BACKWARD_PRE, unit, microbatch);
}

MFSDP_API mfsdp_result mfsdp_backward_post(mfsdp_runtime *rt, int unit, int64_t microbatch)
{
    return mf_replay_hook(rt, MF_PHASE_BACKWARD_POST, unit, microbatch);
}

MFSDP_API mfsdp_result mfsdp_step_end(mfsdp_runtime *rt)
{
    return mf_replay_hook(rt, MF_PHASE_STEP_END, -1, -1);
}

MFSDP_API mfsdp_result mfsdp_synchronize(mfsdp_runtime *rt)
{
    mfsdp_result res = mf_rt_handle_check(rt, "mfsdp_synchronize");
    if (res == MFSDP_OK)
        res = sticky(rt);
    if (res != MFSDP_OK)
        return res;
    if (rt->native) {
        char msg[MF_RT_ERRLEN];
        msg[0] = '\0';
        res = rt->be->synchronize(rt, msg, sizeof msg);
        if (res != MFSDP_OK)
            mf_rt_fail(rt, res, msg);
    } else if (!rt->synchronous) {
        res = mf_streams_drain(rt);
    }
    if (res != MFSDP_OK)
        sticky(rt);
    return res;
}
