/*
 * mf_replay: the replay engine's host side. At create it sorts the schedule's
 * ops into one list per (phase, unit, microbatch class) -- the class says
 * which `when` predicates hold (first, last, both, neither) -- so a hook is a
 * table lookup and a loop, with no allocation and no search. At each hook it
 * checks the call against the schedule's order, issues the list's ops in
 * ascending id (record: next sequence number of its event; wait: the latest
 * issued one) and advances the expected hook.
 *
 * The order is checked by mf_trace.c before anything is issued; its answer
 * (the microbatch position, or a short step's end) picks the list. At a
 * decision point (a step, a microbatch, a short end, an evaluation unit)
 * the ranks then agree on it (mf_agree.c), still before anything is issued.
 */
#include "mf_replay.h"

#include <stdio.h>
#include <string.h>

#include "mf_agree.h"
#include "mf_debug.h"
#include "mf_offload.h"
#include "mf_streams.h"
#include "mf_trace.h"

static int list_index(const mf_schedule *s, mf_phase phase, int unit, int cls)
{
    int slot = unit < 0 ? s->nunits : unit;
    return (((int)phase * (s->nunits + 1)) + slot) * MF_MB_CLASSES + cls;
}

mfsdp_result mf_replay_build_lists(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    rt->nlists = MF_PHASE_COUNT * (s->nunits + 1) * MF_MB_CLASSES;
    rt->list_start = mf_base_calloc((size_t)rt->nlists + 1, sizeof *rt->list_start);
    if (!rt->list_start)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (op lists)");
    /* Two passes: count per list, then fill in ascending op id. */
    int total = 0;
    for (int i = 0; i < s->nops; i++)
        for (int c = 0; c < MF_MB_CLASSES; c++)
            if (mf_when_holds(s->ops[i].when, (unsigned)c)) {
                rt->list_start[list_index(s, s->ops[i].phase, s->ops[i].unit, c) + 1]++;
                total++;
            }
    for (int l = 0; l < rt->nlists; l++)
        rt->list_start[l + 1] += rt->list_start[l];
    rt->list_ops = mf_base_calloc((size_t)(total ? total : 1), sizeof *rt->list_ops);
    int *fill = mf_base_calloc((size_t)rt->nlists, sizeof *fill);
    if (!rt->list_ops || !fill) {
        mf_base_free(fill);
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (op lists)");
    }
    for (int i = 0; i < s->nops; i++)
        for (int c = 0; c < MF_MB_CLASSES; c++)
            if (mf_when_holds(s->ops[i].when, (unsigned)c)) {
                int l = list_index(s, s->ops[i].phase, s->ops[i].unit, c);
                rt->list_ops[rt->list_start[l] + fill[l]++] = i;
            }
    mf_base_free(fill);
    return MFSDP_OK;
}

/* The most entries a stream is issued in one full step. */
static int64_t stream_ops_per_step(const mf_rt *rt, mf_stream st)
{
    const mf_schedule *s = rt->s;
    int64_t n = 0;
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].stream == st)
            n += mf_when_runs_per_step(s->ops[i].when, s->ops[i].phase, s->microbatches);
    return n;
}

int64_t mf_replay_stream_capacity(const mf_rt *rt, mf_stream st)
{
    const mf_schedule *s = rt->s;
    int64_t n = stream_ops_per_step(rt, st);
    for (int i = 0; i < s->nops; i++) /* a short step or an evaluation pass at most adds its program */
        n += s->ops[i].stream == st && !mf_op_in_step(&s->ops[i]);
    return n;
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
        rt->stats.bytes[op->axis] += rt->rops[i].bytes;   /* its form's (whole buckets) */
    }
    if (rt->native) {
        char msg[MF_RT_ERRLEN];
        msg[0] = '\0';
        mfsdp_result r = rt->be->submit(rt, &rt->rops[i], m, seq, msg, sizeof msg);
        if (r != MFSDP_OK)
            mf_base_fail(rt, r, msg);
        return r;
    }
    if (rt->synchronous) {
        mf_rt_entry e = {.op = i, .microbatch = m, .seq = seq};
        char msg[MF_RT_ERRLEN];
        msg[0] = '\0';
        mfsdp_result r = mf_streams_exec(rt, op->stream, &e, msg, sizeof msg, compute_wait_ns);
        if (r != MFSDP_OK)
            mf_base_fail(rt, r, msg);
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

/* Runs a hook: checks the order, issues its ops, advances the state. */
static mfsdp_result run_hook(mf_rt *rt, mf_phase phase, int unit, int64_t m)
{
    if (!mf_base_live(rt)) {
        char fn[48];
        snprintf(fn, sizeof fn, "mfsdp_%s", mf_phase_name(phase));
        return mf_base_handle_check(rt, fn);
    }
    mfsdp_result res = sticky(rt);
    if (res != MFSDP_OK)
        return res;
    unsigned pos;
    if ((res = mf_trace_admit(rt, phase, unit, m, &pos)) != MFSDP_OK)
        return res;
    int l = list_index(rt->s, phase, unit, (int)pos);
    if (rt->check && (res = mf_debug_before(rt, phase, unit, m, l)) != MFSDP_OK)
        return res;
    if ((res = mf_agree_hook(rt, phase, unit, m, pos)) != MFSDP_OK)
        return res;   /* the ranks diverge here: nothing issued, the runtime failed */
    int64_t t0 = mf_base_now_ns(), wait_ns = 0;
    for (int k = rt->list_start[l]; k < rt->list_start[l + 1]; k++) {
        res = issue(rt, rt->list_ops[k], m, &wait_ns);
        if (res != MFSDP_OK)
            break;
    }
    if (!rt->native && !rt->synchronous)
        mf_streams_kick(rt);    /* the hook's entries were queued without waking anyone */
    mf_trace_advance(rt, phase, unit);
    mf_agree_advance(rt, phase);
    if (rt->check && res == MFSDP_OK)
        mf_debug_after(rt, phase, unit, m);
    if (res == MFSDP_OK && phase == MF_PHASE_STEP_END && !rt->native && !rt->synchronous)
        res = mf_streams_drain(rt);
    if (res == MFSDP_OK && phase == MF_PHASE_STEP_END)
        res = mf_offload_step_end(rt);   /* MFSDP_FLAG_OFFLOAD_MAIN: the gradient's host mirror */
    int64_t t1 = mf_base_now_ns();
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
    return run_hook(rt, MF_PHASE_STEP_BEGIN, -1, -1);
}

MFSDP_API mfsdp_result mfsdp_forward_pre(mfsdp_runtime *rt, int unit, int64_t microbatch)
{
    return run_hook(rt, MF_PHASE_FORWARD_PRE, unit, microbatch);
}

MFSDP_API mfsdp_result mfsdp_forward_post(mfsdp_runtime *rt, int unit, int64_t microbatch)
{
    return run_hook(rt, MF_PHASE_FORWARD_POST, unit, microbatch);
}

MFSDP_API mfsdp_result mfsdp_backward_pre(mfsdp_runtime *rt, int unit, int64_t microbatch)
{
    return run_hook(rt, MF_PHASE_BACKWARD_PRE, unit, microbatch);
}

MFSDP_API mfsdp_result mfsdp_backward_post(mfsdp_runtime *rt, int unit, int64_t microbatch)
{
    return run_hook(rt, MF_PHASE_BACKWARD_POST, unit, microbatch);
}

MFSDP_API mfsdp_result mfsdp_step_end(mfsdp_runtime *rt)
{
    return run_hook(rt, MF_PHASE_STEP_END, -1, -1);
}

MFSDP_API mfsdp_result mfsdp_eval_forward_pre(mfsdp_runtime *rt, int unit)
{
    return run_hook(rt, MF_PHASE_EVAL_PRE, unit, -1);
}

MFSDP_API mfsdp_result mfsdp_eval_forward_post(mfsdp_runtime *rt, int unit)
{
    return run_hook(rt, MF_PHASE_EVAL_POST, unit, -1);
}

MFSDP_API mfsdp_result mfsdp_synchronize(mfsdp_runtime *rt)
{
    mfsdp_result res = mf_base_handle_check(rt, "mfsdp_synchronize");
    if (res == MFSDP_OK)
        res = sticky(rt);
    if (res != MFSDP_OK)
        return res;
    if (rt->native) {
        char msg[MF_RT_ERRLEN];
        msg[0] = '\0';
        res = rt->be->synchronize(rt, msg, sizeof msg);
        if (res != MFSDP_OK)
            mf_base_fail(rt, res, msg);
    } else if (!rt->synchronous) {
        res = mf_streams_drain(rt);
    }
    if (res != MFSDP_OK)
        sticky(rt);
    return res;
}
