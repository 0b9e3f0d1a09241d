/*
 * mf_agree: the program agreement of the ranks (see mf_agree.h and
 * docs/runtime.md §4.4). One record per rank rides on the backend's world
 * exchange (be->exchange, the create-time all-gather: the local group's
 * one-rendezvous exchange, an all-gather on the runtime's duplicate of
 * the MPI world, or nccl's small all-gather on its world communicator and
 * its own stream; never a stream's communicator, so it cannot pair with a
 * schedule collective). Every rank compares every record with rank 0's, so
 * every rank reaches the same verdict and formats the same message. A
 * difference fails the runtime (sticky, MFSDP_ERR_MISMATCH); nothing of the
 * hook was issued, and what was issued before it every rank agreed on.
 */
#include "mf_agree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MF_AGREE_MAGIC 0x6d66736470616772ull   /* "mfsdpagr" */

/* What one rank sends (fixed size: the same bytes on every rank). */
typedef struct mf_agree_rec {
    uint64_t magic;         /* MF_AGREE_MAGIC */
    int32_t what;           /* mf_agree_what */
    int32_t unit;           /* MF_AGREE_EVAL: the unit; -1 otherwise */
    int64_t step;           /* the step it is in or about to begin (1, 2, ...) */
    int64_t microbatch;     /* MICROBATCH: the one begun; SHORT_END: those run */
    int64_t arg;            /* HELPER: its bytes per rank */
    char name[32];          /* HELPER: its public name */
} mf_agree_rec;

int64_t mf_agree_env(void)
{
    const char *env = getenv("MFSDP_AGREE");
    return env && !strcmp(env, "0") ? 0 : 1;
}

mfsdp_result mf_agree_create(mf_rt *rt)
{
    /* A backend whose exchange would drain the trainer's streams every step
     * does not declare MF_BE_HOST_EXCHANGE: only a cheap exchange carries it. */
    rt->agree = rt->world > 1 && (rt->be->caps & MF_BE_HOST_EXCHANGE) && mf_agree_env();
    if (!rt->agree)
        return MFSDP_OK;
    rt->agree_all = mf_base_calloc((size_t)rt->world, sizeof(mf_agree_rec));
    if (!rt->agree_all)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (program agreement)");
    return MFSDP_OK;
}

void mf_agree_free(mf_rt *rt)
{
    mf_base_free(rt->agree_all);
    rt->agree_all = NULL;
}

void mf_agree_advance(mf_rt *rt, mf_phase phase)
{
    if (phase == MF_PHASE_STEP_BEGIN)
        rt->steps_begun++;
}

static bool same_rec(const mf_agree_rec *a, const mf_agree_rec *b)
{
    return a->magic == b->magic && a->what == b->what && a->unit == b->unit && a->step == b->step &&
           a->microbatch == b->microbatch && a->arg == b->arg && !strncmp(a->name, b->name, sizeof a->name);
}

/* "begins step 3 (mfsdp_step_begin)": what a group of ranks was about to do. */
static void describe(const mf_rt *rt, const mf_agree_rec *r, char *buf, size_t size)
{
    long long step = (long long)r->step, m = (long long)r->microbatch;
    long long M = (long long)rt->s->microbatches;
    if (r->magic != MF_AGREE_MAGIC) {
        snprintf(buf, size, "sent bytes that are no agreement record (a library of another version?)");
        return;
    }
    switch (r->what) {
    case MF_AGREE_STEP:
        snprintf(buf, size, "begin step %lld (mfsdp_step_begin)", step);
        break;
    case MF_AGREE_MICROBATCH:
        snprintf(buf, size, "begin microbatch %lld of step %lld (mfsdp_forward_pre(unit 0, microbatch %lld))", m,
                 step, m);
        break;
    case MF_AGREE_SHORT_END:
        snprintf(buf, size, "end step %lld after %lld of its %lld microbatches (mfsdp_step_end: a short step)",
                 step, m, M);
        break;
    case MF_AGREE_EVAL: {
        const char *name = r->unit >= 0 && r->unit < rt->s->nunits ? rt->s->units[r->unit].name : "?";
        snprintf(buf, size, "run unit %d \"%s\" of an evaluation pass (%lld steps begun) "
                            "(mfsdp_eval_forward_pre(unit %d))",
                 (int)r->unit, name, step, (int)r->unit);
        break;
    }
    case MF_AGREE_HELPER:
        snprintf(buf, size, "call %.32s (%lld bytes per rank; %lld steps begun)", r->name, (long long)r->arg,
                 step);
        break;
    default:
        snprintf(buf, size, "sent an unknown agreement record (%d)", (int)r->what);
        break;
    }
}

/* The message of a disagreement, identical on every rank: each distinct
 * record once, with the ranks that sent it. */
#define MF_AGREE_DIVERGE "the ranks' programs diverge:"

static void disagreement(const mf_rt *rt, const mf_agree_rec *all, char *msg, size_t size)
{
    size_t at = (size_t)snprintf(msg, size, "%s", MF_AGREE_DIVERGE);
    const char *sep = " ";
    for (int64_t r = 0; r < rt->world && at < size; r++) {
        bool first = true;
        int64_t count = 0;
        for (int64_t q = 0; q < rt->world; q++)
            if (same_rec(&all[q], &all[r])) {
                first &= q >= r;
                count++;
            }
        if (!first)
            continue;
        at += (size_t)snprintf(msg + at, size - at, "%s%s", sep, count > 1 ? "ranks " : "rank ");
        const char *comma = "";
        for (int64_t q = 0; q < rt->world && at < size; q++)
            if (same_rec(&all[q], &all[r])) {
                at += (size_t)snprintf(msg + at, size - at, "%s%lld", comma, (long long)q);
                comma = ",";
            }
        char what[256];
        describe(rt, &all[r], what, sizeof what);
        if (at < size)
            at += (size_t)snprintf(msg + at, size - at, ": %s", what);
        sep = "; ";
    }
    if (at < size)
        snprintf(msg + at, size - at, "; every rank must run the same steps, microbatches, evaluation "
                                      "passes and helpers, in the same order");
}

/* Exchanges mine and compares; on a difference or a failed exchange fails
 * the runtime (sticky) and sets the error on rt. `fn` names the call. */
static mfsdp_result agree(mf_rt *rt, const mf_agree_rec *mine, const char *fn)
{
    char msg[MF_RT_ERRLEN];
    msg[0] = '\0';
    mf_agree_rec *all = rt->agree_all;
    mfsdp_result res = rt->be->exchange(rt, mine, sizeof *mine, all);
    const char *peer = res == MFSDP_ERR_ABORTED ? strstr(rt->err, MF_AGREE_DIVERGE) : NULL;
    if (peer) {
        /* A peer completed this exchange first, found the disagreement and
         * failed, and its failure message aborted our wait: the records are
         * the same on every rank, so the disagreement is ours too. */
        snprintf(msg, sizeof msg, "%s", peer);
        mf_base_fail(rt, MFSDP_ERR_MISMATCH, msg);
        return mf_base_set_error(rt, MFSDP_ERR_MISMATCH, "%s", msg);
    }
    if (res != MFSDP_OK) {
        snprintf(msg, sizeof msg, "%s", rt->err);
        char full[MF_RT_ERRLEN];
        snprintf(full, sizeof full, "%s: the ranks' agreement on the program failed: %.900s", fn, msg);
        mf_base_fail(rt, res, full);
        return mf_base_set_error(rt, res, "%s", full);
    }
    for (int64_t r = 0; r < rt->world; r++)
        if (!same_rec(&all[r], &all[0])) {
            disagreement(rt, all, msg, sizeof msg);
            mf_base_fail(rt, MFSDP_ERR_MISMATCH, msg);
            return mf_base_set_error(rt, MFSDP_ERR_MISMATCH, "%s", msg);
        }
    return MFSDP_OK;
}

mfsdp_result mf_agree_hook(mf_rt *rt, mf_phase phase, int unit, int64_t m, unsigned pos)
{
    if (!rt->agree)
        return MFSDP_OK;
    mf_agree_rec mine;
    memset(&mine, 0, sizeof mine);
    mine.magic = MF_AGREE_MAGIC;
    mine.unit = -1;
    mine.step = rt->steps_begun;
    const char *fn;
    if (phase == MF_PHASE_STEP_BEGIN) {
        mine.what = MF_AGREE_STEP;
        mine.step = rt->steps_begun + 1;
        fn = "mfsdp_step_begin";
    } else if (phase == MF_PHASE_FORWARD_PRE && unit == 0 && m > 0) {
        mine.what = MF_AGREE_MICROBATCH;
        mine.microbatch = m;
        fn = "mfsdp_forward_pre";
    } else if (phase == MF_PHASE_STEP_END && pos == MF_POS_SHORT) {
        mine.what = MF_AGREE_SHORT_END;
        mine.microbatch = rt->next_mb;   /* the microbatches run (the trace state before advancing) */
        fn = "mfsdp_step_end";
    } else if (phase == MF_PHASE_EVAL_PRE) {
        mine.what = MF_AGREE_EVAL;
        mine.unit = unit;
        fn = "mfsdp_eval_forward_pre";
    } else {
        return MFSDP_OK;   /* follows from the trace check */
    }
    return agree(rt, &mine, fn);
}

mfsdp_result mf_agree_helper(mf_rt *rt, const char *fn, int64_t arg)
{
    if (!rt->agree)
        return MFSDP_OK;
    mf_agree_rec mine;
    memset(&mine, 0, sizeof mine);
    mine.magic = MF_AGREE_MAGIC;
    mine.what = MF_AGREE_HELPER;
    mine.unit = -1;
    mine.step = rt->steps_begun;
    mine.arg = arg;
    snprintf(mine.name, sizeof mine.name, "%s", fn);
    return agree(rt, &mine, fn);
}
