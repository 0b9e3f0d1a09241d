/*
 * mf_trace: the hook order a schedule promises (docs/runtime.md §4), checked
 * at every hook. The training step: step_begin; per microbatch m < M,
 * forward_pre/post of units 0..U-1, then backward_pre/post of U-1..0;
 * step_end -- which may also come after any whole microbatch (a short
 * step). Between steps: evaluation passes, eval_forward_pre/post of units
 * 0..U-1, each pass free to stop after any eval_forward_post.
 *
 * The check is a few compares on the hot path; a message is formatted only
 * for a call that is refused.
 */
#include "mf_trace.h"

#include <stdio.h>

void mf_trace_reset(mf_rt *rt)
{
    rt->next_phase = MF_PHASE_STEP_BEGIN;
    rt->next_unit = -1;
    rt->next_mb = 0;
    rt->eval_unit = -1;
    rt->eval_open = false;
}

bool mf_trace_between_steps(const mf_rt *rt)
{
    return rt->next_phase == MF_PHASE_STEP_BEGIN && !rt->eval_open;
}

/* "mfsdp_forward_pre(unit 2 \"layers.1\", microbatch 0)" */
static void describe(const mf_rt *rt, mf_phase phase, int unit, int64_t m, char *buf, size_t size)
{
    const char *name = unit >= 0 && unit < rt->s->nunits ? rt->s->units[unit].name : "?";
    if (mf_phase_is_step(phase))
        snprintf(buf, size, "mfsdp_%s()", mf_phase_name(phase));
    else if (mf_phase_is_eval(phase))
        snprintf(buf, size, "mfsdp_%s(unit %d \"%s\")", mf_phase_name(phase), unit, name);
    else
        snprintf(buf, size, "mfsdp_%s(unit %d \"%s\", microbatch %lld)", mf_phase_name(phase), unit, name,
                 (long long)m);
}

/* What may come next, for messages. */
static void describe_expected(const mf_rt *rt, char *buf, size_t size)
{
    char a[160], b[160];
    if (rt->eval_open) {
        describe(rt, MF_PHASE_EVAL_POST, rt->eval_unit, -1, a, sizeof a);
        snprintf(buf, size, "%s", a);
    } else if (rt->next_phase == MF_PHASE_STEP_BEGIN) {
        int u = rt->eval_unit >= 0 && rt->eval_unit < rt->s->nunits ? rt->eval_unit : 0;
        describe(rt, MF_PHASE_EVAL_PRE, u, -1, b, sizeof b);
        snprintf(buf, size, "mfsdp_step_begin() or, for an evaluation pass, %s", b);
    } else {
        describe(rt, rt->next_phase, rt->next_unit, rt->next_mb, a, sizeof a);
        if (rt->next_phase == MF_PHASE_FORWARD_PRE && rt->next_unit == 0 && rt->next_mb > 0)
            snprintf(buf, size, "%s, or mfsdp_step_end() to end the step after %lld of its %lld microbatches", a,
                     (long long)rt->next_mb, (long long)rt->s->microbatches);
        else
            snprintf(buf, size, "%s", a);
    }
}

static mfsdp_result refuse(mf_rt *rt, mf_phase phase, int unit, int64_t m, const char *why)
{
    char got[160], want[400];
    describe(rt, phase, unit, m, got, sizeof got);
    describe_expected(rt, want, sizeof want);
    return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE, "%s %s: the schedule expects %s next", got, why, want);
}

static mfsdp_result no_programs(mf_rt *rt, const char *what)
{
    return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                             "%s: this schedule (format %s) has no short-step or evaluation program; compile the "
                             "spec again with this mfsdpc (format %s)",
                             what, MF_SCHEDULE_FORMAT_STEP_ONLY, MF_SCHEDULE_FORMAT);
}

static mfsdp_result admit_eval(mf_rt *rt, mf_phase phase, int unit, unsigned *pos)
{
    if (!rt->s->programs)
        return no_programs(rt, phase == MF_PHASE_EVAL_PRE ? "mfsdp_eval_forward_pre" : "mfsdp_eval_forward_post");
    if (rt->next_phase != MF_PHASE_STEP_BEGIN)
        return refuse(rt, phase, unit, -1, "inside a step (an evaluation pass runs between steps: finish the step "
                                           "first)");
    bool ok = phase == MF_PHASE_EVAL_PRE ? !rt->eval_open && (unit == 0 || unit == rt->eval_unit)
                                         : rt->eval_open && unit == rt->eval_unit;
    if (!ok)
        return refuse(rt, phase, unit, -1, "called out of order");
    *pos = MF_POS_FIRST | MF_POS_LAST;
    return MFSDP_OK;
}

mfsdp_result mf_trace_admit(mf_rt *rt, mf_phase phase, int unit, int64_t m, unsigned *pos)
{
    const mf_schedule *s = rt->s;
    bool per_unit = !mf_phase_is_step(phase);
    if (per_unit && (unit < 0 || unit >= s->nunits))
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_%s: unit %d is out of range (the schedule has %d units)", mf_phase_name(phase),
                                 unit, s->nunits);
    if (mf_phase_is_eval(phase))
        return admit_eval(rt, phase, unit, pos);
    if (per_unit && m < 0)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_%s: microbatch %lld is negative",
                                 mf_phase_name(phase), (long long)m);
    if (rt->eval_open)
        return refuse(rt, phase, unit, m, "inside an evaluation window");
    if (per_unit && m >= s->microbatches) {
        char got[160];
        describe(rt, phase, unit, m, got, sizeof got);
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                                 "%s but the schedule has %lld microbatch%s (0..%lld); call mfsdp_step_end to end "
                                 "the step and begin the next one",
                                 got, (long long)s->microbatches, s->microbatches == 1 ? "" : "es",
                                 (long long)s->microbatches - 1);
    }
    bool expected = phase == rt->next_phase && (!per_unit || (unit == rt->next_unit && m == rt->next_mb));
    if (expected) {
        if (per_unit)
            *pos = (m == 0 ? MF_POS_FIRST : 0) | (m == s->microbatches - 1 ? MF_POS_LAST : 0);
        else
            *pos = MF_POS_FIRST | MF_POS_LAST;
        return MFSDP_OK;
    }
    bool short_end = phase == MF_PHASE_STEP_END && rt->next_phase == MF_PHASE_FORWARD_PRE &&
                     rt->next_unit == 0 && rt->next_mb > 0;
    if (short_end && !s->programs)
        return no_programs(rt, "mfsdp_step_end() after a whole microbatch (a short step)");
    if (short_end) {
        *pos = MF_POS_SHORT;
        return MFSDP_OK;
    }
    if (phase == MF_PHASE_STEP_BEGIN && rt->next_phase != MF_PHASE_STEP_BEGIN)
        return refuse(rt, phase, unit, m, "while a step is half done");
    if (phase == MF_PHASE_STEP_END && rt->next_phase == MF_PHASE_STEP_BEGIN)
        return refuse(rt, phase, unit, m, "outside a step");
    return refuse(rt, phase, unit, m, "called out of order");
}

void mf_trace_advance(mf_rt *rt, mf_phase phase, int unit)
{
    int U = rt->s->nunits;
    switch (phase) {
    case MF_PHASE_STEP_BEGIN:
        rt->eval_unit = -1;
        rt->next_mb = 0;
        rt->next_phase = U == 0 ? MF_PHASE_STEP_END : MF_PHASE_FORWARD_PRE;
        rt->next_unit = U == 0 ? -1 : 0;
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
        } else if (rt->next_mb + 1 < rt->s->microbatches) {
            rt->next_phase = MF_PHASE_FORWARD_PRE;
            rt->next_mb++;
        } else {
            rt->next_phase = MF_PHASE_STEP_END;
            rt->next_unit = -1;
        }
        break;
    case MF_PHASE_EVAL_PRE:
        rt->eval_open = true;
        rt->eval_unit = unit;
        break;
    case MF_PHASE_EVAL_POST:
        rt->eval_open = false;
        rt->eval_unit = unit + 1 < U ? unit + 1 : 0;
        break;
    default: /* step_end, full or short */
        mf_trace_reset(rt);
        break;
    }
}
