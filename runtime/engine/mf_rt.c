/*
 * mf_rt: the runtime's life cycle. Creates a rank's runtime (buffers,
 * resolved ops, communicator list, views, the world-wide exchange of
 * schedule hashes), destroys it, and answers the small public queries
 * (versions, names, views, statistics). Schedules are mf_rt_schedule.c's;
 * allocation, errors and clocks mf_base.c's.
 *
 * Invariants: mfsdp_create either returns a complete runtime or frees
 * everything it allocated (every allocation is accounted, see
 * mf_base_alloc_live).
 */
#include "mf_rt.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "mf_abi.h"
#include "mf_agree.h"
#include "mf_debug.h"
#include "mf_free.h"
#include "mf_offload.h"
#include "mf_persist.h"
#include "mf_replay.h"
#include "mf_streams.h"
#include "mf_trace.h"

/* ---- versions, names ---- */

static const char *const result_strings[MFSDP_RESULT_COUNT] = {
    [MFSDP_OK] = "success",
    [MFSDP_ERR_INVALID_ARGUMENT] = "invalid argument",
    [MFSDP_ERR_INVALID_USAGE] = "invalid usage",
    [MFSDP_ERR_LOAD] = "schedule load error",
    [MFSDP_ERR_MISMATCH] = "mismatch between ranks",
    [MFSDP_ERR_TIMEOUT] = "timeout",
    [MFSDP_ERR_OUT_OF_MEMORY] = "out of memory",
    [MFSDP_ERR_BACKEND] = "backend error",
    [MFSDP_ERR_UNSUPPORTED] = "backend not available in this build",
    [MFSDP_ERR_ABORTED] = "aborted by a failed peer",
    [MFSDP_ERR_INTERNAL] = "internal error",
};

MFSDP_API const char *mfsdp_result_string(mfsdp_result r)
{
    if ((int)r < 0 || r >= MFSDP_RESULT_COUNT)
        return "unknown result";
    return result_strings[r];
}

#define MF_STR2(x) #x
#define MF_STR(x) MF_STR2(x)

MFSDP_API const char *mfsdp_version(void)
{
    return MF_STR(MFSDP_VERSION_MAJOR) "." MF_STR(MFSDP_VERSION_MINOR) "." MF_STR(
        MFSDP_VERSION_PATCH);
}

MFSDP_API int mfsdp_version_code(void)
{
    return MFSDP_VERSION_CODE;
}

MFSDP_API size_t mfsdp_dtype_size(mfsdp_dtype d)
{
    return mf_dtype_size((mf_dtype)d);
}

MFSDP_API const char *mfsdp_dtype_name(mfsdp_dtype d)
{
    const char *n = mf_dtype_name((mf_dtype)d);
    return n ? n : "unknown";
}

/* The backend for a config, or NULL when not built in. */
static const mf_backend_vtbl *backend_for(mfsdp_backend b)
{
    switch (b) {
    case MFSDP_BACKEND_LOCAL:
        return &mf_backend_local;
#ifdef MFSDP_HAVE_MPI
    case MFSDP_BACKEND_MPI:
        return &mf_backend_mpi;
#endif
    /* --- CUDA/NCCL backend --- */
#ifdef MFSDP_HAVE_CUDA
    case MFSDP_BACKEND_NCCL:
        return &mf_backend_nccl;
    case MFSDP_BACKEND_CUDA_LOCAL:
        return &mf_backend_cuda_local;
#endif
    default:
        return NULL;
    }
}

MFSDP_API int mfsdp_backend_available(mfsdp_backend b)
{
    return backend_for(b) != NULL;
}

MFSDP_API void mfsdp_config_init(mfsdp_config *cfg)
{
    if (!cfg)
        return;
    *cfg = (mfsdp_config)MFSDP_CONFIG_INIT;
}

/* ---- create ---- */

/* ---- whole buckets: the form of their collectives ---- */

/* A collective of a bucket with a whole role (mf_bucket.whole). */
static bool whole_collective(const mf_schedule *s, const mf_op *op)
{
    if (!mf_opkind_is_collective(op->kind) || op->bucket < 0 || op->bucket >= s->nbuckets ||
        op->axis < 0 || op->axis >= s->mesh.naxes)
        return false;
    for (int role = 0; role < MF_ROLE_COUNT; role++)
        if (s->buckets[op->bucket].whole[role])
            return true;
    return false;
}

typedef enum { MF_WHOLE_AUTO, MF_WHOLE_PADDED, MF_WHOLE_PREFIX } mf_whole_form;

static const char *whole_form_name(int64_t f)
{
    return f == MF_WHOLE_PADDED ? "padded" : f == MF_WHOLE_PREFIX ? "prefix" : "unset";
}

/* MFSDP_WHOLE_COLLECTIVES, read at create. */
static mfsdp_result whole_form_env(mf_whole_form *out)
{
    const char *env = getenv("MFSDP_WHOLE_COLLECTIVES");
    *out = MF_WHOLE_AUTO;
    if (!env || !*env)
        return MFSDP_OK;
    if (!strcmp(env, "padded"))
        *out = MF_WHOLE_PADDED;
    else if (!strcmp(env, "prefix"))
        *out = MF_WHOLE_PREFIX;
    else
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "MFSDP_WHOLE_COLLECTIVES=%s: expected padded or prefix (unset: "
                                 "prefix wherever it moves fewer bytes)",
                                 env);
    return MFSDP_OK;
}

/*
 * The chunks of a whole collective (docs/runtime.md, "Whole buckets"): for
 * each member c of the op's axis group, the used prefix of its range on the
 * op's shard side and where that range starts in the op's full side (src of
 * a reduce_scatter, dst of an all_gather), relative to this rank's range
 * there (mf_layout_bucket_range: c * count for equal shards, the bounds in a
 * ragged bucket). A ragged bucket (format 7) has only this form; a bucket of
 * equal shards (built in memory) takes it where it moves fewer bytes in all
 * unless MFSDP_WHOLE_COLLECTIVES forces a form. Every member of the op's
 * group computes the same table from the same schedule. table: the entries
 * behind rt->rops, 2 * nranks per op (used, then disp).
 */
static mfsdp_result whole_forms(mf_rt *rt, int64_t *table)
{
    const mf_schedule *s = rt->s;
    mf_whole_form form;
    mfsdp_result res = whole_form_env(&form);
    if (res != MFSDP_OK)
        return res;
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (!whole_collective(s, op))
            continue;
        mf_rt_op *r = &rt->rops[i];
        const mf_bucket *b = &s->buckets[op->bucket];
        int64_t n = r->nranks, cnt = op->count;
        int64_t *used = table, *disp = table + n;
        table += 2 * n;
        int full_buf = op->kind == MF_OP_ALL_GATHER ? op->dst : op->src;
        int shard_buf = op->kind == MF_OP_REDUCE_SCATTER ? op->dst : op->src;
        if (full_buf < 0 || shard_buf < 0 || cnt <= 0)
            continue;
        const mf_placement *fp = &s->buffers[full_buf].place, *sp = &s->buffers[shard_buf].place;
        if (!b->bounds && mf_layout_shards(&s->mesh, sp) * cnt != b->length)
            continue;   /* not the rank's shard of the bucket: the padded form */
        if (b->bounds && form == MF_WHOLE_PADDED)
            return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                     "MFSDP_WHOLE_COLLECTIVES=padded: bucket '%s' has ragged shards "
                                     "(mfsdp-schedule/7), which have no padded form; unset it",
                                     b->name);
        int64_t full = mf_layout_bucket_range(&s->mesh, b, fp, rt->rank).offset, sum = 0;
        const int64_t *group = rt->comms[r->comm].ranks; /* the axis group, coord order */
        int64_t cc[MF_MAX_AXES];
        for (int64_t c = 0; c < n; c++) {
            mf_layout_mesh_coords(&s->mesh, group[c], cc);
            mf_range m = mf_layout_bucket_range(&s->mesh, b, sp, group[c]);
            used[c] = mf_layout_shard_used(&s->mesh, sp, b, mf_layout_shard_index(&s->mesh, sp, cc));
            disp[c] = op->kind == MF_OP_ALL_REDUCE ? 0 : m.offset - full;
            sum += used[c];
        }
        if (!b->bounds && (form == MF_WHOLE_PADDED || (form == MF_WHOLE_AUTO && sum >= n * cnt)))
            continue;
        r->used = used;
        r->disp = disp;
        r->bytes = mf_layout_prefix_bytes(op->kind, n, sum, used[r->coord], op->dtype);
    }
    return MFSDP_OK;
}

/* What a local op touches on this rank (mf_rt_op.n, .src_at): its count,
 * a slice at coord * count, unless its bucket is ragged, where it works on
 * the rank's own range (the destination's; a slice reads it inside the
 * source's range) -- the ops' semantics by ranges, docs/semantics.md §4.6. */
static void local_extent(const mf_rt *rt, const mf_op *op, mf_rt_op *r)
{
    const mf_schedule *s = rt->s;
    r->n = op->count;
    r->src_at = op->kind == MF_OP_SLICE ? r->coord * op->count : 0;
    if (mf_opkind_is_collective(op->kind) || op->bucket < 0 || op->src < 0 || op->dst < 0 ||
        !s->buckets[op->bucket].bounds)
        return;
    const mf_bucket *b = &s->buckets[op->bucket];
    mf_range sr = mf_layout_bucket_range(&s->mesh, b, &s->buffers[op->src].place, rt->rank);
    mf_range dr = mf_layout_bucket_range(&s->mesh, b, &s->buffers[op->dst].place, rt->rank);
    r->n = dr.len;
    r->src_at = dr.offset - sr.offset;
}

/* Resolves op pointers and the communicator list. */
static mfsdp_result resolve_ops(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    for (int st = 0; st < MF_STREAM_COUNT; st++)
        for (int j = 0; j < MF_MAX_AXES; j++)
            rt->comm_index[st][j] = -1;
    rt->ncomms = 0;
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (mf_opkind_is_collective(op->kind) && rt->comm_index[op->stream][op->axis] < 0)
            rt->comm_index[op->stream][op->axis] = rt->ncomms++;
    }
    rt->comms = mf_base_calloc((size_t)(rt->ncomms ? rt->ncomms : 1), sizeof *rt->comms);
    if (!rt->comms)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (communicators)");
    for (int st = 0; st < MF_STREAM_COUNT; st++)
        for (int j = 0; j < s->mesh.naxes; j++) {
            int c = rt->comm_index[st][j];
            if (c < 0)
                continue;
            mf_rt_comm *cm = &rt->comms[c];
            cm->axis = j;
            cm->stream = (mf_stream)st;
            cm->nranks = s->mesh.axes[j].size;
            cm->coord = rt->coords[j];
            cm->color = mf_layout_axis_color(&s->mesh, j, rt->rank);
            cm->ranks = mf_base_calloc((size_t)cm->nranks, sizeof *cm->ranks);
            if (!cm->ranks)
                return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY,
                                         "out of memory (communicator ranks)");
            mf_layout_axis_group(&s->mesh, j, rt->rank, cm->ranks);
        }
    /* The prefix tables of whole collectives live behind the ops (one allocation). */
    int64_t nused = 0;
    for (int i = 0; i < s->nops; i++)
        if (whole_collective(s, &s->ops[i]))
            nused += 2 * s->mesh.axes[s->ops[i].axis].size;
    size_t ops_bytes = (size_t)(s->nops ? s->nops : 1) * sizeof *rt->rops;
    rt->rops = mf_base_calloc(1, ops_bytes + (size_t)nused * sizeof(int64_t));
    if (!rt->rops)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (ops)");
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        mf_rt_op *r = &rt->rops[i];
        r->op = op;
        r->comm = -1;
        r->nranks = 1;
        if (op->src >= 0) {
            r->src = rt->bufs[op->src];
            r->src_count = mf_persist_held(s, op->src, rt->rank);
            r->src_dtype = s->buffers[op->src].dtype;
        }
        if (op->dst >= 0) {
            r->dst = rt->bufs[op->dst];
            r->dst_count = mf_persist_held(s, op->dst, rt->rank);
            r->dst_dtype = s->buffers[op->dst].dtype;
        }
        r->overlap = op->src >= 0 && op->src == op->dst;
        if (op->axis >= 0 && op->axis < s->mesh.naxes) {
            r->nranks = s->mesh.axes[op->axis].size;
            r->coord = rt->coords[op->axis];
        }
        local_extent(rt, op, r);
        if (mf_opkind_is_collective(op->kind)) {
            r->comm = rt->comm_index[op->stream][op->axis];
            r->bytes = mf_schedule_collective_bytes(op->kind, r->nranks, op->count, op->dtype);
        }
    }
    return whole_forms(rt, (int64_t *)(void *)((char *)rt->rops + ops_bytes));
}

static mfsdp_result build_views(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    const mfsdp_schedule *h = rt->sh;
    rt->nviews = h->ntensors;
    rt->views = mf_base_calloc((size_t)(h->ntensors ? h->ntensors : 1), sizeof *rt->views);
    if (!rt->views)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (views)");
    /* Per bucket: the unsharded weight, grad_local, main_weight and delivered gradient. */
    for (int k = 0; k < h->ntensors; k++) {
        const mf_rt_tensor *rt_t = &h->tensors[k];
        const mf_bucket *bk = &s->buckets[rt_t->bucket];
        const mf_tensor *t = &bk->tensors[rt_t->index];
        int full = -1, weight = -1, local = -1, mw = -1, grad = -1, final = -1;
        for (int i = 0; i < s->nbuffers; i++) {
            if (s->buffers[i].bucket != rt_t->bucket)
                continue;
            switch (s->buffers[i].kind) {
            case MF_BUF_WEIGHT_FULL: full = i; break;
            case MF_BUF_WEIGHT: weight = i; break;
            case MF_BUF_GRAD_LOCAL: local = i; break;
            case MF_BUF_MAIN_WEIGHT: mw = i; break;
            case MF_BUF_GRAD: grad = i; break;
            case MF_BUF_GRAD_FINAL: final = i; break;
            default: break;
            }
        }
        int unsharded = full >= 0 ? full : weight;
        int delivered = final >= 0 ? final : grad;
        mfsdp_tensor_view *v = &rt->views[k];
        mf_rt_schedule_tensor_id(h, k, &v->name, &v->unit, &v->ndims, v->dims, &v->numel);
        const mf_buffer *ub = &s->buffers[unsharded], *lb = &s->buffers[local];
        const mf_buffer *mb = &s->buffers[mw], *db = &s->buffers[delivered];
        v->weight = (char *)rt->bufs[unsharded] + (size_t)t->offset * mf_dtype_size(ub->dtype);
        v->weight_dtype = (mfsdp_dtype)ub->dtype;
        v->grad_local = (char *)rt->bufs[local] + (size_t)t->offset * mf_dtype_size(lb->dtype);
        v->grad_local_dtype = (mfsdp_dtype)lb->dtype;
        v->main_weight_dtype = (mfsdp_dtype)mb->dtype;
        v->grad_dtype = (mfsdp_dtype)db->dtype;
        mf_range r = mf_layout_bucket_range(&s->mesh, bk, &bk->place[MF_ROLE_MAIN_WEIGHT], rt->rank);
        int64_t lo = t->offset > r.offset ? t->offset : r.offset;
        int64_t hi = t->offset + t->numel < r.offset + r.len ? t->offset + t->numel : r.offset + r.len;
        if (hi > lo) {
            v->shard_offset = lo - t->offset;
            v->shard_count = hi - lo;
            v->main_weight = (char *)rt->bufs[mw] + (size_t)(lo - r.offset) * mf_dtype_size(mb->dtype);
            char *dbase = mf_offload_mirror(rt, delivered);   /* the host mirror, offloaded */
            if (!dbase)
                dbase = rt->bufs[delivered];
            v->grad = dbase + (size_t)(lo - r.offset) * mf_dtype_size(db->dtype);
        }
    }
    return MFSDP_OK;
}

/* What every rank sends in the create exchange. */
typedef struct mf_rt_hello {
    uint8_t hash[32];
    int64_t status;         /* mfsdp_result of this rank's setup */
    int64_t mesh_world;     /* the world its schedule wants */
    int64_t axes[MF_MAX_AXES]; /* its mesh shape (0 past the last axis) */
    int64_t whole_form;     /* its MFSDP_WHOLE_COLLECTIVES (mf_whole_form) */
    int64_t agree;          /* its MFSDP_AGREE (mf_agree_env) */
} mf_rt_hello;

/* Compares every rank's hello; on a difference formats a message naming the
 * ranks, identical on every rank. */
static mfsdp_result check_hellos(mf_rt *rt, const mf_rt_hello *all, int64_t world)
{
    for (int64_t r = 0; r < world; r++)
        if (all[r].status != MFSDP_OK && r != rt->rank)
            return mf_base_set_error(NULL, MFSDP_ERR_ABORTED,
                                     "rank %lld failed to create its runtime (%s); no rank can proceed",
                                     (long long)r, mfsdp_result_string((mfsdp_result)all[r].status));
    for (int64_t r = 1; r < world; r++)
        if (all[r].whole_form != all[0].whole_form)   /* the forms of a collective would differ */
            return mf_base_set_error(NULL, MFSDP_ERR_MISMATCH,
                                     "MFSDP_WHOLE_COLLECTIVES differs between rank 0 (%s) and rank "
                                     "%lld (%s): set it alike on every rank",
                                     whole_form_name(all[0].whole_form), (long long)r,
                                     whole_form_name(all[r].whole_form));
    for (int64_t r = 1; r < world; r++)
        if (all[r].agree != all[0].agree)   /* one rank would wait in exchanges the other skips */
            return mf_base_set_error(NULL, MFSDP_ERR_MISMATCH,
                                     "MFSDP_AGREE differs between rank 0 (%lld) and rank %lld (%lld): set "
                                     "it alike on every rank",
                                     (long long)all[0].agree, (long long)r, (long long)all[r].agree);
    bool same = true;
    for (int64_t r = 1; r < world; r++)
        if (memcmp(all[r].hash, all[0].hash, 32) != 0 || all[r].mesh_world != all[0].mesh_world)
            same = false;
    if (same)
        return MFSDP_OK;
    /* Group the ranks by hash: "ranks 0,1,3 have 1a2b3c4d...; rank 2 has ...". */
    char msg[MF_RT_ERRLEN];
    size_t at = (size_t)snprintf(msg, sizeof msg, "schedule hash mismatch:");
    for (int64_t r = 0; r < world && at < sizeof msg; r++) {
        bool first = true;
        int64_t count = 0;
        for (int64_t q = 0; q < world; q++)
            if (memcmp(all[q].hash, all[r].hash, 32) == 0 && all[q].mesh_world == all[r].mesh_world) {
                first &= q >= r;
                count++;
            }
        if (!first)
            continue;
        at += (size_t)snprintf(msg + at, sizeof msg - at, " %s", count > 1 ? "ranks" : "rank");
        const char *sep = " ";
        for (int64_t q = r; q < world && at < sizeof msg; q++)
            if (memcmp(all[q].hash, all[r].hash, 32) == 0 && all[q].mesh_world == all[r].mesh_world) {
                at += (size_t)snprintf(msg + at, sizeof msg - at, "%s%lld", sep, (long long)q);
                sep = ",";
            }
        if (at < sizeof msg)
            at += (size_t)snprintf(msg + at, sizeof msg - at,
                                   " %s %02x%02x%02x%02x%02x%02x%02x%02x (mesh ",
                                   count > 1 ? "have" : "has", all[r].hash[0], all[r].hash[1],
                                   all[r].hash[2], all[r].hash[3], all[r].hash[4], all[r].hash[5],
                                   all[r].hash[6], all[r].hash[7]);
        for (int j = 0; j < MF_MAX_AXES && all[r].axes[j] > 0 && at < sizeof msg; j++)
            at += (size_t)snprintf(msg + at, sizeof msg - at, "%s%lld", j ? " x " : "",
                                   (long long)all[r].axes[j]);
        if (at < sizeof msg)
            at += (size_t)snprintf(msg + at, sizeof msg - at, ", %lld ranks);",
                                   (long long)all[r].mesh_world);
    }
    if (at < sizeof msg)
        snprintf(msg + at, sizeof msg - at, " every rank must load the same schedule file");
    return mf_base_set_error(NULL, MFSDP_ERR_MISMATCH, "%s", msg);
}

/* One allocation per rank: the persistent region, then the transient arena
 * at the planned size; every buffer is a view at its offset (the loader
 * checked that each lies inside its region, and that buffers sharing bytes
 * are never live together). The persistent region is this rank's own
 * (core/mf_persist.h): a ragged bucket's persistent buffers hold only the
 * rank's ranges, so ranks allocate different sizes, each at most
 * mem_persistent. Check mode (CPU backends) poisons a buffer
 * outside its window, which would overwrite the buffer sharing its bytes
 * inside that one's window: there every transient buffer gets bytes of its
 * own (the sum of the transient buffers, not the arena; docs/runtime.md §13). */
static mfsdp_result place_buffers(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    bool own = (rt->cfg.flags & MFSDP_FLAG_CHECK) && !rt->native;
    int64_t align = s->align > 0 ? s->align : 1, transient = s->mem_transient;
    if (own) {
        transient = 0;
        for (int b = 0; b < s->nbuffers; b++)
            if (s->buffers[b].lifetime == MF_LIFETIME_MICROBATCH)
                transient += (s->buffers[b].count * mf_dtype_size(s->buffers[b].dtype) + align - 1) /
                             align * align;
    }
    int64_t *at = mf_base_calloc((size_t)(s->nbuffers ? s->nbuffers : 1), sizeof *at);
    if (!at)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (buffer offsets)");
    int64_t pers = mf_persist_layout(s, rt->rank, at);
    size_t total = (size_t)(pers + transient);
    mfsdp_result res = rt->be->alloc(rt, total ? total : 1, &rt->mem_base);
    if (res != MFSDP_OK) {
        rt->mem_base = NULL;
        mf_base_free(at);
        return mf_base_set_error(NULL, res, "cannot allocate the arena (%zu bytes): %s", total, rt->err);
    }
    rt->mem_bytes = (int64_t)total;
    char *next = (char *)rt->mem_base + pers;   /* check mode's own bytes */
    for (int b = 0; b < s->nbuffers; b++) {
        const mf_buffer *bf = &s->buffers[b];
        if (bf->lifetime != MF_LIFETIME_MICROBATCH) {
            rt->bufs[b] = (char *)rt->mem_base + at[b];
        } else if (!own) {
            rt->bufs[b] = (char *)rt->mem_base + pers + bf->offset;
        } else {
            rt->bufs[b] = next;
            next += (bf->count * mf_dtype_size(bf->dtype) + align - 1) / align * align;
        }
    }
    mf_base_free(at);
    return MFSDP_OK;
}

/* Allocates buffers and tables; everything that can fail locally. */
static mfsdp_result setup(mf_rt *rt)
{
    mfsdp_result res = MFSDP_OK;
    const mf_schedule *s = rt->s;
    if (rt->world != s->mesh.world)
        return mf_base_set_error(NULL, MFSDP_ERR_MISMATCH,
                                 "the backend's world has %lld ranks but the schedule's mesh needs %lld",
                                 (long long)rt->world, (long long)s->mesh.world);
    mf_layout_mesh_coords(&s->mesh, rt->rank, rt->coords);
    rt->bufs = mf_base_calloc((size_t)(s->nbuffers ? s->nbuffers : 1), sizeof *rt->bufs);
    if (!rt->bufs)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (buffer table)");
    MF_CHECKGOTO(place_buffers(rt), res, done);
    MF_CHECKGOTO(mf_offload_place(rt), res, done);   /* main_weight to pinned host memory */
    MF_CHECKGOTO(resolve_ops(rt), res, done);
    MF_CHECKGOTO(build_views(rt), res, done);
    MF_CHECKGOTO(mf_replay_build_lists(rt), res, done);
    MF_CHECKGOTO(mf_debug_create(rt), res, done);
    MF_CHECKGOTO(mf_agree_create(rt), res, done);
    rt->ev_issued = mf_base_calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *rt->ev_issued);
    rt->ev_done = mf_base_calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *rt->ev_done);
    if (!rt->ev_issued || !rt->ev_done)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (events)");
    if (!rt->native && !rt->synchronous) {
        for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
            mf_rt_stream *q = &rt->streams[st];
            q->cap = mf_replay_stream_capacity(rt, (mf_stream)st);
            q->queue = mf_base_calloc((size_t)(q->cap ? q->cap : 1), sizeof *q->queue);
            if (!q->queue)
                return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (queues)");
        }
        /* Before the exchange, so that peers learn of a thread that cannot
         * start (docs/runtime.md §2); idle until the first hook. */
        if ((res = mf_streams_start(rt)) != MFSDP_OK)
            return mf_base_set_error(NULL, res, "%s", rt->err);
    }
done:
    return res;
}

static void release(mf_rt *rt)
{
    if (rt->mem_base)
        rt->be->free(rt, rt->mem_base);
    mf_offload_free(rt);
    mf_base_free(rt->bufs);
    if (rt->be_state)
        rt->be->close(rt);
    for (int c = 0; rt->comms && c < rt->ncomms; c++)
        mf_base_free(rt->comms[c].ranks);
    MF_FREE_ALL_WITH(mf_base_free, rt->comms, rt->rops, rt->list_start, rt->list_ops, rt->ev_issued, rt->ev_done,
                     rt->views);
    mf_debug_free(rt);
    mf_agree_free(rt);
    for (int st = 0; st < MF_STREAM_COUNT; st++) {
        mf_base_free(rt->streams[st].queue);
        if (rt->sync_ready && st != MF_STREAM_COMPUTE)
            pthread_cond_destroy(&rt->streams[st].work);
    }
    if (rt->sync_ready) {
        pthread_cond_destroy(&rt->cv);
        pthread_mutex_destroy(&rt->mu);
    }
    mf_base_free(rt);
}

/* The mutex and condition variables; on failure destroys what it made and
 * leaves rt->sync_ready false (release() then destroys none). */
static bool init_sync(mf_rt *rt)
{
    if (pthread_mutex_init(&rt->mu, NULL) != 0)
        return false;
    if (mf_base_cond_init(&rt->cv) != 0) {
        pthread_mutex_destroy(&rt->mu);
        return false;
    }
    int nwork = 0;
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++, nwork++)
        if (mf_base_cond_init(&rt->streams[st].work) != 0)
            break;
    if (nwork != MF_STREAM_COUNT - MF_STREAM_INNER) {
        for (int st = MF_STREAM_INNER; st < MF_STREAM_INNER + nwork; st++)
            pthread_cond_destroy(&rt->streams[st].work);
        pthread_cond_destroy(&rt->cv);
        pthread_mutex_destroy(&rt->mu);
        return false;
    }
    rt->sync_ready = true;
    return true;
}

/* Arguments of mfsdp_create: MFSDP_OK, or the error (set). */
static mfsdp_result check_create_args(const mfsdp_schedule *sh, const mfsdp_config *cfg, mfsdp_runtime **out)
{
    if (!out)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_create: out is NULL");
    *out = NULL;
    if (!sh || !cfg)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_create: schedule and config must not be NULL");
    char abi[512];
    if (mf_abi_check_config(cfg, abi, sizeof abi) != MFSDP_OK) /* before any other field is read */
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_create: %s", abi);
    if (!backend_for(cfg->backend))
        return mf_base_set_error(NULL, MFSDP_ERR_UNSUPPORTED,
                                 "mfsdp_create: backend %d is not built into this library "
                                 "(check mfsdp_backend_available)",
                                 (int)cfg->backend);
    if (cfg->timeout_ms < 0)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_create: timeout_ms is %lld (0 = no limit, or a positive limit)",
                                 (long long)cfg->timeout_ms);
    return MFSDP_OK;
}

/*
 * The local setup, then the exchange of every rank's schedule hash and
 * setup status; a local failure is still announced in the exchange so peers
 * fail with it instead of waiting for this rank. MFSDP_OK or the error (set).
 */
static mfsdp_result setup_and_greet(mf_rt *rt)
{
    mfsdp_result local = setup(rt);
    char local_msg[MF_RT_ERRLEN];
    snprintf(local_msg, sizeof local_msg, "%s", mfsdp_last_error(NULL));

    mf_rt_hello mine;
    memset(&mine, 0, sizeof mine);
    memcpy(mine.hash, rt->s->hash, 32);
    mine.status = local;
    mine.mesh_world = rt->s->mesh.world;
    mf_whole_form form = MF_WHOLE_AUTO;
    if (local == MFSDP_OK)
        whole_form_env(&form);   /* read by setup already: valid */
    mine.whole_form = form;
    mine.agree = mf_agree_env();
    for (int j = 0; j < rt->s->mesh.naxes && j < MF_MAX_AXES; j++)
        mine.axes[j] = rt->s->mesh.axes[j].size;
    mf_rt_hello *all = mf_base_calloc((size_t)rt->world, sizeof *all);
    if (!all) /* cannot even take part in the exchange: peers will time out */
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (hash exchange)");
    mfsdp_result res = rt->be->exchange(rt, &mine, sizeof mine, all);
    if (res != MFSDP_OK)
        mf_base_set_error(NULL, res, "schedule hash exchange failed: %s", rt->err);
    else if (local != MFSDP_OK)
        res = mf_base_set_error(NULL, local, "%s", local_msg);
    else
        res = check_hellos(rt, all, rt->world);
    mf_base_free(all);
    return res;
}

MFSDP_API mfsdp_result mfsdp_create(const mfsdp_schedule *sh, const mfsdp_config *cfg,
                                    mfsdp_runtime **out)
{
    mfsdp_result res = check_create_args(sh, cfg, out);
    if (res != MFSDP_OK)
        return res;
    const mf_backend_vtbl *be = backend_for(cfg->backend);
    mf_rt *rt = mf_base_calloc(1, sizeof *rt);
    if (!rt)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (runtime)");
    rt->sh = sh;
    rt->s = sh->s;
    rt->cfg = *cfg;
    rt->cfg.flags = mf_debug_flags(cfg->flags);   /* MFSDP_CHECK=1 in the environment */
    rt->be = be;
    rt->native = (be->caps & MF_BE_NATIVE_STREAMS) != 0;
    rt->synchronous = !rt->native && (rt->cfg.flags & MFSDP_FLAG_SYNCHRONOUS);
    mf_trace_reset(rt);
    for (int st = 0; st < MF_STREAM_COUNT; st++) {
        rt->streams[st].rt = rt;
        rt->streams[st].id = (mf_stream)st;
        rt->streams[st].current = -1;
    }
    if (!init_sync(rt)) {
        res = mf_base_set_error(NULL, MFSDP_ERR_INTERNAL, "cannot initialize a mutex or condition variable");
        goto fail;
    }
    res = be->open(rt, cfg, &rt->rank, &rt->world);
    if (res != MFSDP_OK) {
        mf_base_set_error(NULL, res, "%s backend: %s", be->name, rt->err);
        goto fail;
    }
    res = setup_and_greet(rt);
    if (res != MFSDP_OK)
        goto fail;
    res = be->comm_init(rt, rt->comms, rt->ncomms);
    if (res != MFSDP_OK) {
        mf_base_set_error(NULL, res, "%s backend: cannot create communicators: %s", be->name, rt->err);
        goto fail;
    }
    rt->err[0] = '\0';
    rt->magic = MF_RT_MAGIC;
    *out = rt;
    return MFSDP_OK;

fail:
    if (rt->sync_ready && !rt->native && !rt->synchronous)
        mf_streams_stop(rt);   /* joins the stream threads setup() started, if any */
    release(rt);
    return res;
}

MFSDP_API void mfsdp_destroy(mfsdp_runtime *rt)
{
    if (!mf_base_live(rt))
        return;   /* NULL, or destroyed already */
    bool in_flight = !rt->native && !rt->synchronous && mf_streams_busy(rt);
    pthread_mutex_lock(&rt->mu);
    bool failed = rt->failed != MFSDP_OK;
    pthread_mutex_unlock(&rt->mu);
    /* A rank that gives up in the middle of a step after an error (e.g. a
     * hook out of order) will never join its peers' collectives. */
    bool gave_up = !mf_trace_between_steps(rt) && rt->err[0] != '\0';
    if (in_flight || failed || gave_up) {
        /* The rank's own last error is the root cause peers should see. */
        char why[768];
        pthread_mutex_lock(&rt->mu);
        const char *cause = failed ? rt->fail_msg : rt->err;
        snprintf(why, sizeof why, "rank %lld was destroyed with %s%s%.600s", (long long)rt->rank,
                 failed ? "a failed step" : in_flight ? "ops in flight" : "a step half done",
                 cause[0] ? "; its error: " : "", cause);
        pthread_mutex_unlock(&rt->mu);
        rt->be->abort(rt, why);
    }
    if (!rt->native && !rt->synchronous)
        mf_streams_stop(rt);
    rt->magic = 0;
    release(rt);
}

/* ---- queries ---- */

MFSDP_API int64_t mfsdp_allocated_bytes(const mfsdp_runtime *rt)
{
    return mf_base_live(rt) ? rt->mem_bytes : 0;
}

MFSDP_API int64_t mfsdp_rank(const mfsdp_runtime *rt)
{
    return mf_base_live(rt) ? rt->rank : -1;
}

MFSDP_API int64_t mfsdp_world_size(const mfsdp_runtime *rt)
{
    return mf_base_live(rt) ? rt->world : 0;
}

MFSDP_API int64_t mfsdp_coord(const mfsdp_runtime *rt, int axis)
{
    if (!mf_base_live(rt) || axis < 0 || axis >= rt->s->mesh.naxes)
        return -1;
    return rt->coords[axis];
}

MFSDP_API int mfsdp_num_tensors(const mfsdp_runtime *rt)
{
    return mf_base_live(rt) ? rt->nviews : 0;
}

MFSDP_API mfsdp_result mfsdp_tensor_view_get(mfsdp_runtime *rt, int index, mfsdp_tensor_view *out)
{
    mfsdp_result res = mf_base_handle_check(rt, "mfsdp_tensor_view_get");
    if (res != MFSDP_OK)
        return res;
    if (!out || index < 0 || index >= rt->nviews)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_tensor_view_get: tensor index %d out of range [0, %d)", index,
                               rt->nviews);
    *out = rt->views[index];
    return MFSDP_OK;
}

MFSDP_API int mfsdp_tensor_find(const mfsdp_runtime *rt, const char *name)
{
    if (!mf_base_live(rt) || !name)
        return -1;
    for (int i = 0; i < rt->nviews; i++)
        if (strcmp(rt->views[i].name, name) == 0)
            return i;
    return -1;
}

MFSDP_API mfsdp_result mfsdp_get_stats(const mfsdp_runtime *crt, mfsdp_stats *out)
{
    mfsdp_result res = mf_base_handle_check(crt, "mfsdp_get_stats");
    if (res != MFSDP_OK)
        return res;
    if (!out)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_get_stats: out is NULL");
    mf_rt *rt = (mf_rt *)crt;   /* the mutex is the only thing touched */
    pthread_mutex_lock(&rt->mu);
    *out = rt->stats;
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
        out->busy_ns[st] += rt->streams[st].busy_ns;
        out->wait_ns[st] += rt->streams[st].wait_ns;
    }
    pthread_mutex_unlock(&rt->mu);
    return MFSDP_OK;
}

void *mf_rt_buffer(const mf_rt *rt, int b)
{
    return rt && b >= 0 && b < rt->s->nbuffers ? rt->bufs[b] : NULL;
}
