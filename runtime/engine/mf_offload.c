/*
 * mf_offload: MFSDP_FLAG_OFFLOAD_MAIN (mf_offload.h): the placement decision,
 * the host block's layout, its allocation at create, the gradient mirror's
 * copy at step_end and the public offload queries.
 */
#include "mf_offload.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "mf_persist.h"
#include "mf_rt_schedule.h"

struct mf_offload {
    mf_offload_mode mode;
    void *host;                 /* the pinned block (be->alloc_host); NULL unless active */
    int64_t host_bytes;         /* its size */
    int64_t main_bytes;         /* main_weight's part, aligned */
    int64_t grad_bytes;         /* the gradient mirror's part, aligned */
    void **mirror;              /* per buffer: a delivered gradient's mirror, else NULL */
    char status[256];           /* mfsdp_offload_status */
    bool fake;                  /* host from mf_base (mf_offload_fake_host_alloc) */
};

static _Atomic bool fake_host;  /* mf_offload_fake_host_alloc */

void mf_offload_fake_host_alloc(bool on)
{
    atomic_store(&fake_host, on);
}

/* Per bucket, the buffer the views deliver the gradient from (as
 * mf_rt.c's build_views): grad_final, else grad; -1 when none. */
static int delivered_of(const mf_schedule *s, int bucket)
{
    int grad = -1;
    for (int b = 0; b < s->nbuffers; b++) {
        if (s->buffers[b].bucket != bucket)
            continue;
        if (s->buffers[b].kind == MF_BUF_GRAD_FINAL)
            return b;
        if (s->buffers[b].kind == MF_BUF_GRAD)
            grad = b;
    }
    return grad;
}

static bool is_main(const mf_schedule *s, int b)
{
    return b >= 0 && b < s->nbuffers && s->buffers[b].kind == MF_BUF_MAIN_WEIGHT;
}

int mf_offload_refusing_op(const mf_schedule *s)
{
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (mf_opkind_is_collective(op->kind) && (is_main(s, op->src) || is_main(s, op->dst)))
            return i;
    }
    return -1;
}

mf_offload_mode mf_offload_decide(const mf_schedule *s, uint32_t flags, bool host_alloc, int *op)
{
    if (op)
        *op = -1;
    if (!(flags & MFSDP_FLAG_OFFLOAD_MAIN))
        return MF_OFFLOAD_OFF;
    if (!host_alloc)
        return MF_OFFLOAD_NOOP;
    int bad = mf_offload_refusing_op(s);
    if (op)
        *op = bad;
    return bad >= 0 ? MF_OFFLOAD_REFUSED : MF_OFFLOAD_ACTIVE;
}

int64_t mf_offload_layout(const mf_schedule *s, int64_t *host_off, int64_t *main_bytes,
                          int64_t *grad_bytes)
{
    int64_t align = s->align > 0 ? s->align : 1, at = 0;
    for (int b = 0; b < s->nbuffers; b++)
        host_off[b] = -1;
    for (int b = 0; b < s->nbuffers; b++)
        if (is_main(s, b)) {
            host_off[b] = at;
            at += (s->buffers[b].count * (int64_t)mf_dtype_size(s->buffers[b].dtype) + align - 1) /
                  align * align;
        }
    int64_t mains = at;
    for (int k = 0; k < s->nbuckets; k++) {
        int b = delivered_of(s, k);
        if (b < 0 || host_off[b] >= 0)
            continue;
        host_off[b] = at;
        at += (s->buffers[b].count * (int64_t)mf_dtype_size(s->buffers[b].dtype) + align - 1) /
              align * align;
    }
    if (main_bytes)
        *main_bytes = mains;
    if (grad_bytes)
        *grad_bytes = at - mains;
    return at;
}

/* The message of a refused schedule (handle-less: create fails). */
static mfsdp_result refuse(mf_rt *rt, int op)
{
    char what[160];
    mf_base_describe_op(rt, op, what, sizeof what);
    const mf_op *o = &rt->s->ops[op];
    int b = is_main(rt->s, o->src) ? o->src : o->dst;
    return mf_base_set_error(NULL, MFSDP_ERR_UNSUPPORTED,
                             "MFSDP_FLAG_OFFLOAD_MAIN on the %s backend: %s is a collective on "
                             "main_weight buffer '%s', which would have to be device memory "
                             "(collectives read and write device memory only); mfsdpc's schedules "
                             "cast from main_weight first: recompile the schedule, or create the "
                             "runtime without the flag",
                             rt->be->name, what, rt->s->buffers[b].name);
}

/* Allocates the block and repoints the buffers (mode ACTIVE). */
static mfsdp_result place_host(mf_rt *rt, struct mf_offload *o)
{
    const mf_schedule *s = rt->s;
    int64_t *off = mf_base_calloc((size_t)(s->nbuffers ? s->nbuffers : 1), sizeof *off);
    o->mirror = mf_base_calloc((size_t)(s->nbuffers ? s->nbuffers : 1), sizeof *o->mirror);
    if (!off || !o->mirror) {
        mf_base_free(off);
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (offload table)");
    }
    o->host_bytes = mf_offload_layout(s, off, &o->main_bytes, &o->grad_bytes);
    size_t bytes = (size_t)(o->host_bytes ? o->host_bytes : 1);
    mfsdp_result res = o->fake ? mf_base_host_alloc(rt, bytes, &o->host)
                               : rt->be->alloc_host(rt, bytes, &o->host);
    if (res != MFSDP_OK) {
        o->host = NULL;
        mf_base_free(off);
        return mf_base_set_error(NULL, res, "MFSDP_FLAG_OFFLOAD_MAIN on the %s backend (%lld bytes of "
                                 "pinned host memory): %s", rt->be->name, (long long)o->host_bytes,
                                 rt->err);
    }
    for (int b = 0; b < s->nbuffers; b++) {
        if (off[b] < 0)
            continue;
        if (is_main(s, b))
            rt->bufs[b] = (char *)o->host + off[b];
        else
            o->mirror[b] = (char *)o->host + off[b];
    }
    mf_base_free(off);
    snprintf(o->status, sizeof o->status,
             "offload active: %lld bytes of main_weight and a %lld-byte gradient mirror in pinned "
             "host memory on the %s backend", (long long)o->main_bytes, (long long)o->grad_bytes,
             rt->be->name);
    return MFSDP_OK;
}

mfsdp_result mf_offload_place(mf_rt *rt)
{
    int op = -1;
    bool fake = !rt->be->alloc_host && atomic_load(&fake_host);
    mf_offload_mode mode = mf_offload_decide(rt->s, rt->cfg.flags, rt->be->alloc_host || fake, &op);
    if (mode == MF_OFFLOAD_OFF)
        return MFSDP_OK;
    if (mode == MF_OFFLOAD_REFUSED)
        return refuse(rt, op);
    struct mf_offload *o = mf_base_calloc(1, sizeof *o);
    if (!o)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (offload)");
    o->mode = mode;
    o->fake = fake;
    rt->offload = o;
    if (mode == MF_OFFLOAD_ACTIVE)
        return place_host(rt, o);
    snprintf(o->status, sizeof o->status,
             "offload inactive: the %s backend keeps every buffer in host memory already "
             "(MFSDP_FLAG_OFFLOAD_MAIN is a no-op on CPU backends)", rt->be->name);
    return MFSDP_OK;
}

void *mf_offload_mirror(const mf_rt *rt, int b)
{
    const struct mf_offload *o = rt->offload;
    return o && o->mirror && b >= 0 && b < rt->s->nbuffers ? o->mirror[b] : NULL;
}

mfsdp_result mf_offload_step_end(mf_rt *rt)
{
    struct mf_offload *o = rt->offload;
    if (!o || o->mode != MF_OFFLOAD_ACTIVE)
        return MFSDP_OK;
    char msg[MF_RT_ERRLEN];
    msg[0] = '\0';
    mfsdp_result res = rt->native ? rt->be->synchronize(rt, msg, sizeof msg) : MFSDP_OK;
    const mf_schedule *s = rt->s;
    for (int b = 0; b < s->nbuffers && res == MFSDP_OK; b++)
        if (o->mirror[b] && mf_persist_held(s, b, rt->rank) > 0) /* a ragged bucket's: the rank's range */
            res = rt->be->stage(rt, o->mirror[b], rt->bufs[b],
                                (size_t)mf_persist_held(s, b, rt->rank) * mf_dtype_size(s->buffers[b].dtype),
                                msg, sizeof msg);
    if (res != MFSDP_OK) {
        char why[MF_RT_ERRLEN];
        snprintf(why, sizeof why, "step_end: copying the delivered gradient into its pinned host "
                 "mirror (MFSDP_FLAG_OFFLOAD_MAIN): %.900s", msg);
        mf_base_fail(rt, res, why);
    }
    return res;
}

void mf_offload_free(mf_rt *rt)
{
    struct mf_offload *o = rt->offload;
    if (!o)
        return;
    if (o->host && o->fake)
        mf_base_host_free(rt, o->host);
    else if (o->host)
        rt->be->free_host(rt, o->host);
    mf_base_free(o->mirror);
    mf_base_free(o);
    rt->offload = NULL;
}

/* ---- public queries ---- */

MFSDP_API int mfsdp_offload_active(const mfsdp_runtime *rt)
{
    return mf_base_live(rt) && rt->offload && rt->offload->mode == MF_OFFLOAD_ACTIVE;
}

MFSDP_API const char *mfsdp_offload_status(const mfsdp_runtime *rt)
{
    if (!mf_base_live(rt))
        return "no runtime";
    if (!rt->offload)
        return "offload not requested (MFSDP_FLAG_OFFLOAD_MAIN is not set)";
    return rt->offload->status;
}

MFSDP_API int64_t mfsdp_offload_host_bytes(const mfsdp_runtime *rt)
{
    return mfsdp_offload_active(rt) ? rt->offload->host_bytes : 0;
}

MFSDP_API int mfsdp_schedule_offload_op(const mfsdp_schedule *s)
{
    return s && s->s ? mf_offload_refusing_op(s->s) : -1;
}
