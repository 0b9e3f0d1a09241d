/*
 * mf_rt: the runtime's life cycle. Loads and checks schedules, creates a
 * rank's runtime (buffers, resolved ops, communicator list, views, the
 * world-wide exchange of schedule hashes), destroys it, and answers the small
 * public queries (versions, errors, views, statistics).
 *
 * Invariants: mfsdp_create either returns a complete runtime or frees
 * everything it allocated (every allocation is accounted, see
 * mf_rt_alloc_live); the schedule handle is read-only after load, so any
 * number of thread-ranks may share it.
 */
#include "mf_rt.h"
#include "mf_trace.h"
#include "mf_verify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "mf_debug.h"
#include "mf_load.h"
#include "mf_struct.h"

/* ---- accounted allocation ---- */

static atomic_llong alloc_live;
static atomic_llong alloc_fail_countdown = -1;

static bool alloc_injected_failure(void)
{
    if (atomic_load(&alloc_fail_countdown) < 0)
        return false;
    return atomic_fetch_sub(&alloc_fail_countdown, 1) == 0;
}

void mf_rt_alloc_fail_at(int64_t k)
{
    atomic_store(&alloc_fail_countdown, (long long)(k < 0 ? -1 : k));
}

int64_t mf_rt_alloc_live(void)
{
    return atomic_load(&alloc_live);
}

void *mf_rt_malloc(size_t n)
{
    if (alloc_injected_failure())
        return NULL;
    void *p = malloc(n ? n : 1);
    if (p)
        atomic_fetch_add(&alloc_live, 1);
    return p;
}

void *mf_rt_calloc(size_t n, size_t size)
{
    if (alloc_injected_failure())
        return NULL;
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p)
        atomic_fetch_add(&alloc_live, 1);
    return p;
}

/* Whether allocations of MF_RT_HUGE_MIN bytes and more ask for transparent
 * huge pages (MFSDP_HUGE_PAGES=0 in the environment: no). */
static bool huge_pages_wanted(void)
{
    const char *env = getenv("MFSDP_HUGE_PAGES");
    return !(env && strcmp(env, "0") == 0);
}

void *mf_rt_aligned_zalloc(size_t align, size_t n)
{
    if (alloc_injected_failure())
        return NULL;
    void *p = NULL;
    bool huge = n >= MF_RT_HUGE_MIN && huge_pages_wanted();
    if (huge && align < MF_RT_HUGE_MIN)
        align = MF_RT_HUGE_MIN;
    if (posix_memalign(&p, align, n ? n : 1) != 0)
        return NULL;
    /* Before the first touch, so that the zeroing below already faults in
     * huge pages (a hint: without THP the pages stay small). */
    if (huge)
        (void)madvise(p, n & ~(MF_RT_HUGE_MIN - 1), MADV_HUGEPAGE);
    memset(p, 0, n);
    atomic_fetch_add(&alloc_live, 1);
    return p;
}

mfsdp_result mf_rt_host_alloc(mf_rt *rt, size_t bytes, void **out)
{
    *out = mf_rt_aligned_zalloc(256, bytes);
    if (!*out)
        return mf_rt_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", bytes);
    return MFSDP_OK;
}

void mf_rt_host_free(mf_rt *rt, void *p)
{
    (void)rt;
    mf_rt_free(p);
}

void mf_rt_free(void *p)
{
    if (!p)
        return;
    atomic_fetch_sub(&alloc_live, 1);
    free(p);
}

/* ---- errors, clocks ---- */

static _Thread_local char thread_err[MF_RT_ERRLEN];

mfsdp_result mf_rt_set_error(mf_rt *rt, mfsdp_result code, const char *fmt, ...)
{
    char *buf = rt ? rt->err : thread_err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, MF_RT_ERRLEN, fmt, ap);
    va_end(ap);
    return code;
}

/* Reads the magic of a handle that may have been freed: ASan would report
 * that read, and its quarantine keeps the memory mapped, which is what the
 * check is for (best effort). */
__attribute__((no_sanitize_address)) bool mf_rt_live(const mf_rt *rt)
{
    return rt && rt->magic == MF_RT_MAGIC;
}

mfsdp_result mf_rt_handle_check(const mf_rt *rt, const char *fn)
{
    if (mf_rt_live(rt))
        return MFSDP_OK;
    if (!rt)
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "%s: rt is NULL", fn);
    return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_USAGE,
                           "%s: rt is not a live runtime (destroyed by mfsdp_destroy, or not made "
                           "by mfsdp_create)",
                           fn);
}

void mf_rt_fail(mf_rt *rt, mfsdp_result code, const char *msg)
{
    pthread_mutex_lock(&rt->mu);
    if (rt->failed == MFSDP_OK) {
        rt->failed = code;
        snprintf(rt->fail_msg, sizeof rt->fail_msg, "%s", msg);
    }
    pthread_cond_broadcast(&rt->cv);
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++)
        pthread_cond_broadcast(&rt->streams[st].work);
    pthread_mutex_unlock(&rt->mu);
}

void mf_rt_fail_and_abort(mf_rt *rt, mfsdp_result code, const char *msg)
{
    mf_rt_fail(rt, code, msg);
    /* Peers learn the root cause: the first failure of this runtime, which
     * may be another stream's (a wait interrupted by it fails later, but
     * can reach this point first). */
    char first[sizeof rt->fail_msg];
    pthread_mutex_lock(&rt->mu);
    snprintf(first, sizeof first, "%s", rt->fail_msg);
    pthread_mutex_unlock(&rt->mu);
    rt->be->abort(rt, first);
}

int64_t mf_rt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct timespec mf_rt_deadline(int64_t timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (timeout_ms > 0) {
        ts.tv_sec += (time_t)(timeout_ms / 1000);
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
    }
    return ts;
}

int mf_rt_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t timeout_ms,
                    const struct timespec *deadline)
{
    if (timeout_ms <= 0)
        return pthread_cond_wait(cv, mu);
    return pthread_cond_timedwait(cv, mu, deadline);
}

int mf_rt_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

void mf_rt_describe_op(const mf_rt *rt, int i, char *buf, size_t size)
{
    const mf_schedule *s = rt->s;
    const mf_op *op = &s->ops[i];
    const char *unit = op->unit >= 0 && op->unit < s->nunits ? s->units[op->unit].name : "-";
    if (mf_opkind_is_collective(op->kind) && op->axis >= 0 && op->axis < s->mesh.naxes)
        snprintf(buf, size, "op %d (%s %s on %s, %s of unit %s)", i, mf_opkind_name(op->kind),
                 s->mesh.axes[op->axis].name, mf_stream_name(op->stream), mf_phase_name(op->phase),
                 unit);
    else if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
        snprintf(buf, size, "op %d (%s event %d on %s, %s of unit %s)", i, mf_opkind_name(op->kind),
                 op->event, mf_stream_name(op->stream), mf_phase_name(op->phase), unit);
    else
        snprintf(buf, size, "op %d (%s on %s, %s of unit %s)", i, mf_opkind_name(op->kind),
                 mf_stream_name(op->stream), mf_phase_name(op->phase), unit);
}

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

const mf_backend_vtbl *mf_rt_backend_for(mfsdp_backend b)
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
    return mf_rt_backend_for(b) != NULL;
}

MFSDP_API void mfsdp_config_init(mfsdp_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = MFSDP_BACKEND_LOCAL;
    cfg->rank = -1;
    cfg->timeout_ms = 600000;
}

/* ---- schedules ---- */

/* Longest unit name in [first, last] that prefixes `name` followed by '.'. */
static int tensor_unit(const mf_schedule *s, const mf_bucket *b, const char *name)
{
    if (b->last_unit <= b->unit)
        return b->unit;
    int best = b->unit;
    size_t best_len = 0;
    for (int u = b->unit; u <= b->last_unit && u < s->nunits; u++) {
        size_t n = strlen(s->units[u].name);
        if (n > best_len && strncmp(name, s->units[u].name, n) == 0 && name[n] == '.') {
            best = u;
            best_len = n;
        }
    }
    return best;
}

mfsdp_result mf_rt_schedule_wrap(mf_schedule *s, mfsdp_schedule **out, char *err, size_t errlen)
{
    *out = NULL;
    /* The loader ran these rules already; a schedule built in memory has not. */
    if (!mf_struct_check_first(s, err, errlen)) {
        mf_schedule_free(s);
        return MFSDP_ERR_LOAD;
    }
    mfsdp_schedule *h = mf_rt_calloc(1, sizeof *h);
    int nt = 0;
    for (int b = 0; b < s->nbuckets; b++)
        nt += s->buckets[b].ntensors;
    mf_rt_tensor *t = mf_arena_array(s->arena, (size_t)(nt ? nt : 1), sizeof *t);
    if (!h || !t) {
        mf_rt_free(h);
        mf_schedule_free(s);
        snprintf(err, errlen, "out of memory");
        return MFSDP_ERR_OUT_OF_MEMORY;
    }
    int k = 0;
    for (int b = 0; b < s->nbuckets; b++)
        for (int i = 0; i < s->buckets[b].ntensors; i++, k++) {
            t[k].bucket = b;
            t[k].index = i;
            t[k].unit = tensor_unit(s, &s->buckets[b], s->buckets[b].tensors[i].name);
        }
    h->s = s;
    h->ntensors = nt;
    h->tensors = t;
    *out = h;
    return MFSDP_OK;
}

/*
 * Verify on load (docs/runtime.md §2): the verifier's structure, replay and
 * memory checks (core/mf_verify.c) on every schedule a trainer loads, so a
 * hand-edited or damaged schedule is refused with the verifier's located
 * message instead of replaying wrong. MFSDP_VERIFY=0 in the environment skips
 * it for a trusted schedule (the loader's own checks still run). Takes s on
 * failure.
 */
static bool verify_loaded(mf_schedule *s, char *err, size_t errlen)
{
    const char *env = getenv("MFSDP_VERIFY");
    if (env && strcmp(env, "0") == 0)
        return true;
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) {
        snprintf(err, errlen, "%s: out of memory (verifying the schedule)", s->source ? s->source : "<schedule>");
        mf_schedule_free(s);
        return false;
    }
    mf_source src = {s->source ? s->source : "<schedule>", NULL, 0};
    mf_diag d;
    mf_diag_init(&d, &src, mem);
    d.max_errors = 1;
    int n = mf_verify_run(s, &d);
    fclose(mem);
    if (n > 0) {
        size_t first = text ? strcspn(text, "\n") : 0;
        snprintf(err, errlen, "%.*s (the verifier found %d error%s; mfsdpc compile the spec again, or check "
                 "the schedule with mfsdpc check)",
                 (int)(first < 700 ? first : 700), text ? text : "", n, n == 1 ? "" : "s");
        mf_schedule_free(s);
    }
    free(text);
    return n == 0;
}

MFSDP_API mfsdp_result mfsdp_schedule_load(const char *path, mfsdp_schedule **out)
{
    if (!path || !out)
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                               "mfsdp_schedule_load: path and out must not be NULL");
    *out = NULL;
    mf_schedule *s = mf_schedule_load_file(path, thread_err, sizeof thread_err);
    if (!s) {
        mf_rt_spec_hint_file(path, thread_err, sizeof thread_err);
        return MFSDP_ERR_LOAD;
    }
    if (!verify_loaded(s, thread_err, sizeof thread_err))
        return MFSDP_ERR_LOAD;
    return mf_rt_schedule_wrap(s, out, thread_err, sizeof thread_err);
}

MFSDP_API mfsdp_result mfsdp_schedule_load_buffer(const char *name, const void *text, size_t len,
                                                  mfsdp_schedule **out)
{
    if (!text || !out)
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                               "mfsdp_schedule_load_buffer: text and out must not be NULL");
    *out = NULL;
    mf_schedule *s = mf_schedule_load_buffer(name ? name : "<buffer>", text, len, thread_err,
                                             sizeof thread_err);
    if (!s) {
        mf_rt_spec_hint(name ? name : "<buffer>", text, len, thread_err, sizeof thread_err);
        return MFSDP_ERR_LOAD;
    }
    if (!verify_loaded(s, thread_err, sizeof thread_err))
        return MFSDP_ERR_LOAD;
    return mf_rt_schedule_wrap(s, out, thread_err, sizeof thread_err);
}

MFSDP_API void mfsdp_schedule_free(mfsdp_schedule *h)
{
    if (!h)
        return;
    mf_schedule_free(h->s);
    mf_rt_free(h);
}

MFSDP_API int64_t mfsdp_schedule_world_size(const mfsdp_schedule *h)
{
    return h ? h->s->mesh.world : 0;
}

MFSDP_API int mfsdp_schedule_num_axes(const mfsdp_schedule *h)
{
    return h ? h->s->mesh.naxes : 0;
}

MFSDP_API const char *mfsdp_schedule_axis_name(const mfsdp_schedule *h, int axis)
{
    return h && axis >= 0 && axis < h->s->mesh.naxes ? h->s->mesh.axes[axis].name : NULL;
}

MFSDP_API int64_t mfsdp_schedule_peak_bytes(const mfsdp_schedule *h)
{
    return h ? h->s->mem_persistent + h->s->mem_transient : 0;
}

MFSDP_API int64_t mfsdp_allocated_bytes(const mfsdp_runtime *rt)
{
    return mf_rt_live(rt) ? rt->mem_bytes : 0;
}

MFSDP_API int64_t mfsdp_schedule_axis_size(const mfsdp_schedule *h, int axis)
{
    return h && axis >= 0 && axis < h->s->mesh.naxes ? h->s->mesh.axes[axis].size : 0;
}

MFSDP_API int64_t mfsdp_schedule_microbatches(const mfsdp_schedule *h)
{
    return h ? h->s->microbatches : 0;
}

MFSDP_API int mfsdp_schedule_num_units(const mfsdp_schedule *h)
{
    return h ? h->s->nunits : 0;
}

MFSDP_API const char *mfsdp_schedule_unit_name(const mfsdp_schedule *h, int unit)
{
    return h && unit >= 0 && unit < h->s->nunits ? h->s->units[unit].name : NULL;
}

MFSDP_API int mfsdp_schedule_reduce_is_avg(const mfsdp_schedule *h)
{
    return h && h->s->reduce == MF_REDUCE_AVG;
}

MFSDP_API void mfsdp_schedule_hash(const mfsdp_schedule *h, uint8_t out[32])
{
    if (h && out)
        memcpy(out, h->s->hash, 32);
}

MFSDP_API int mfsdp_schedule_num_tensors(const mfsdp_schedule *h)
{
    return h ? h->ntensors : 0;
}

MFSDP_API mfsdp_result mfsdp_schedule_tensor_info(const mfsdp_schedule *h, int index,
                                                  mfsdp_tensor_info *out)
{
    if (!h || !out || index < 0 || index >= h->ntensors)
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                               "mfsdp_schedule_tensor_info: index %d out of range [0, %d)", index,
                               h ? h->ntensors : 0);
    const mf_rt_tensor *rt_t = &h->tensors[index];
    const mf_bucket *bk = &h->s->buckets[rt_t->bucket];
    const mf_tensor *t = &bk->tensors[rt_t->index];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->unit = rt_t->unit;
    out->ndims = t->ndims;
    for (int d = 0; d < t->ndims && d < MFSDP_MAX_DIMS; d++)
        out->dims[d] = t->dims[d];
    out->numel = t->numel;
    out->weight_dtype = (mfsdp_dtype)bk->dtype[MF_ROLE_WEIGHT];
    out->grad_dtype = (mfsdp_dtype)bk->dtype[MF_ROLE_GRAD];
    out->main_weight_dtype = (mfsdp_dtype)bk->dtype[MF_ROLE_MAIN_WEIGHT];
    return MFSDP_OK;
}

/* ---- create ---- */

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
    rt->comms = mf_rt_calloc((size_t)(rt->ncomms ? rt->ncomms : 1), sizeof *rt->comms);
    if (!rt->comms)
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (communicators)");
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
            cm->color = mf_mesh_axis_color(&s->mesh, j, rt->rank);
            cm->ranks = mf_rt_calloc((size_t)cm->nranks, sizeof *cm->ranks);
            if (!cm->ranks)
                return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY,
                                       "out of memory (communicator ranks)");
            mf_mesh_axis_group(&s->mesh, j, rt->rank, cm->ranks);
        }
    rt->rops = mf_rt_calloc((size_t)(s->nops ? s->nops : 1), sizeof *rt->rops);
    if (!rt->rops)
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (ops)");
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        mf_rt_op *r = &rt->rops[i];
        r->op = op;
        r->comm = -1;
        r->nranks = 1;
        if (op->src >= 0) {
            r->src = rt->bufs[op->src];
            r->src_count = s->buffers[op->src].count;
            r->src_dtype = s->buffers[op->src].dtype;
        }
        if (op->dst >= 0) {
            r->dst = rt->bufs[op->dst];
            r->dst_count = s->buffers[op->dst].count;
            r->dst_dtype = s->buffers[op->dst].dtype;
        }
        r->overlap = op->src >= 0 && op->src == op->dst;
        if (op->axis >= 0 && op->axis < s->mesh.naxes) {
            r->nranks = s->mesh.axes[op->axis].size;
            r->coord = rt->coords[op->axis];
        }
        if (mf_opkind_is_collective(op->kind))
            r->comm = rt->comm_index[op->stream][op->axis];
    }
    return MFSDP_OK;
}

static mfsdp_result build_views(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    const mfsdp_schedule *h = rt->sh;
    rt->nviews = h->ntensors;
    rt->views = mf_rt_calloc((size_t)(h->ntensors ? h->ntensors : 1), sizeof *rt->views);
    if (!rt->views)
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (views)");
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
        v->name = t->name;
        v->unit = rt_t->unit;
        v->ndims = t->ndims;
        for (int d = 0; d < t->ndims && d < MFSDP_MAX_DIMS; d++)
            v->dims[d] = t->dims[d];
        v->numel = t->numel;
        const mf_buffer *ub = &s->buffers[unsharded], *lb = &s->buffers[local];
        const mf_buffer *mb = &s->buffers[mw], *db = &s->buffers[delivered];
        v->weight = (char *)rt->bufs[unsharded] + (size_t)t->offset * mf_dtype_size(ub->dtype);
        v->weight_dtype = (mfsdp_dtype)ub->dtype;
        v->grad_local = (char *)rt->bufs[local] + (size_t)t->offset * mf_dtype_size(lb->dtype);
        v->grad_local_dtype = (mfsdp_dtype)lb->dtype;
        v->main_weight_dtype = (mfsdp_dtype)mb->dtype;
        v->grad_dtype = (mfsdp_dtype)db->dtype;
        mf_range r = mf_layout_range(&s->mesh, &bk->place[MF_ROLE_MAIN_WEIGHT], rt->rank, bk->length);
        int64_t lo = t->offset > r.offset ? t->offset : r.offset;
        int64_t hi = t->offset + t->numel < r.offset + r.len ? t->offset + t->numel : r.offset + r.len;
        if (hi > lo) {
            v->shard_offset = lo - t->offset;
            v->shard_count = hi - lo;
            v->main_weight = (char *)rt->bufs[mw] + (size_t)(lo - r.offset) * mf_dtype_size(mb->dtype);
            v->grad = (char *)rt->bufs[delivered] + (size_t)(lo - r.offset) * mf_dtype_size(db->dtype);
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
} mf_rt_hello;

/* Compares every rank's hello; on a difference formats a message naming the
 * ranks, identical on every rank. */
static mfsdp_result check_hellos(mf_rt *rt, const mf_rt_hello *all, int64_t world)
{
    for (int64_t r = 0; r < world; r++)
        if (all[r].status != MFSDP_OK && r != rt->rank)
            return mf_rt_set_error(NULL, MFSDP_ERR_ABORTED,
                                   "rank %lld failed to create its runtime (%s); no rank can proceed",
                                   (long long)r, mfsdp_result_string((mfsdp_result)all[r].status));
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
    return mf_rt_set_error(NULL, MFSDP_ERR_MISMATCH, "%s", msg);
}

/* One allocation per rank: the persistent region, then the transient arena
 * at the planned size; every buffer is a view at its offset (the loader
 * checked that each lies inside its region, and that buffers sharing bytes
 * are never live together). Check mode (CPU backends) poisons a buffer
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
    size_t total = (size_t)(s->mem_persistent + transient);
    mfsdp_result res = rt->be->alloc(rt, total ? total : 1, &rt->mem_base);
    if (res != MFSDP_OK) {
        rt->mem_base = NULL;
        return mf_rt_set_error(NULL, res, "cannot allocate the arena (%zu bytes): %s", total, rt->err);
    }
    rt->mem_bytes = (int64_t)total;
    char *next = (char *)rt->mem_base + s->mem_persistent;   /* check mode's own bytes */
    for (int b = 0; b < s->nbuffers; b++) {
        const mf_buffer *bf = &s->buffers[b];
        if (bf->lifetime != MF_LIFETIME_MICROBATCH) {
            rt->bufs[b] = (char *)rt->mem_base + bf->offset;
        } else if (!own) {
            rt->bufs[b] = (char *)rt->mem_base + s->mem_persistent + bf->offset;
        } else {
            rt->bufs[b] = next;
            next += (bf->count * mf_dtype_size(bf->dtype) + align - 1) / align * align;
        }
    }
    return MFSDP_OK;
}

/* Allocates buffers and tables; everything that can fail locally. */
static mfsdp_result setup(mf_rt *rt)
{
    mfsdp_result res = MFSDP_OK;
    const mf_schedule *s = rt->s;
    if (rt->world != s->mesh.world)
        return mf_rt_set_error(NULL, MFSDP_ERR_MISMATCH,
                               "the backend's world has %lld ranks but the schedule's mesh needs %lld",
                               (long long)rt->world, (long long)s->mesh.world);
    mf_mesh_coords(&s->mesh, rt->rank, rt->coords);
    rt->bufs = mf_rt_calloc((size_t)(s->nbuffers ? s->nbuffers : 1), sizeof *rt->bufs);
    if (!rt->bufs)
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (buffer table)");
    MF_CHECKGOTO(place_buffers(rt), res, done);
    MF_CHECKGOTO(resolve_ops(rt), res, done);
    MF_CHECKGOTO(build_views(rt), res, done);
    MF_CHECKGOTO(mf_replay_build_lists(rt), res, done);
    MF_CHECKGOTO(mf_debug_create(rt), res, done);
    rt->ev_issued = mf_rt_calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *rt->ev_issued);
    rt->ev_done = mf_rt_calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *rt->ev_done);
    if (!rt->ev_issued || !rt->ev_done)
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (events)");
    if (!rt->native && !rt->synchronous)
        for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
            mf_rt_stream *q = &rt->streams[st];
            q->cap = mf_replay_stream_capacity(rt, (mf_stream)st);
            q->queue = mf_rt_calloc((size_t)(q->cap ? q->cap : 1), sizeof *q->queue);
            if (!q->queue)
                return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (queues)");
        }
done:
    return res;
}

static void release(mf_rt *rt)
{
    if (rt->mem_base)
        rt->be->free(rt, rt->mem_base);
    mf_rt_free(rt->bufs);
    if (rt->be_state)
        rt->be->close(rt);
    for (int c = 0; rt->comms && c < rt->ncomms; c++)
        mf_rt_free(rt->comms[c].ranks);
    mf_rt_free(rt->comms);
    mf_rt_free(rt->rops);
    mf_rt_free(rt->list_start);
    mf_rt_free(rt->list_ops);
    mf_rt_free(rt->ev_issued);
    mf_rt_free(rt->ev_done);
    mf_rt_free(rt->views);
    mf_debug_free(rt);
    for (int st = 0; st < MF_STREAM_COUNT; st++) {
        mf_rt_free(rt->streams[st].queue);
        if (rt->sync_ready && st != MF_STREAM_COMPUTE)
            pthread_cond_destroy(&rt->streams[st].work);
    }
    if (rt->sync_ready) {
        pthread_cond_destroy(&rt->cv);
        pthread_mutex_destroy(&rt->mu);
    }
    mf_rt_free(rt);
}

/* The mutex and condition variables; on failure destroys what it made and
 * leaves rt->sync_ready false (release() then destroys none). */
static bool init_sync(mf_rt *rt)
{
    if (pthread_mutex_init(&rt->mu, NULL) != 0)
        return false;
    if (mf_rt_cond_init(&rt->cv) != 0) {
        pthread_mutex_destroy(&rt->mu);
        return false;
    }
    int nwork = 0;
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++, nwork++)
        if (mf_rt_cond_init(&rt->streams[st].work) != 0)
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
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_create: out is NULL");
    *out = NULL;
    if (!sh || !cfg)
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                               "mfsdp_create: schedule and config must not be NULL");
    if (!mf_rt_backend_for(cfg->backend))
        return mf_rt_set_error(NULL, MFSDP_ERR_UNSUPPORTED,
                               "mfsdp_create: backend %d is not built into this library "
                               "(check mfsdp_backend_available)",
                               (int)cfg->backend);
    if (cfg->timeout_ms < 0)
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
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
    for (int j = 0; j < rt->s->mesh.naxes && j < MF_MAX_AXES; j++)
        mine.axes[j] = rt->s->mesh.axes[j].size;
    mf_rt_hello *all = mf_rt_calloc((size_t)rt->world, sizeof *all);
    if (!all) /* cannot even take part in the exchange: peers will time out */
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (hash exchange)");
    mfsdp_result res = rt->be->exchange(rt, &mine, sizeof mine, all);
    if (res != MFSDP_OK)
        mf_rt_set_error(NULL, res, "schedule hash exchange failed: %s", rt->err);
    else if (local != MFSDP_OK)
        res = mf_rt_set_error(NULL, local, "%s", local_msg);
    else
        res = check_hellos(rt, all, rt->world);
    mf_rt_free(all);
    return res;
}

MFSDP_API mfsdp_result mfsdp_create(const mfsdp_schedule *sh, const mfsdp_config *cfg,
                                    mfsdp_runtime **out)
{
    mfsdp_result res = check_create_args(sh, cfg, out);
    if (res != MFSDP_OK)
        return res;
    const mf_backend_vtbl *be = mf_rt_backend_for(cfg->backend);
    mf_rt *rt = mf_rt_calloc(1, sizeof *rt);
    if (!rt)
        return mf_rt_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (runtime)");
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
        res = mf_rt_set_error(NULL, MFSDP_ERR_INTERNAL, "cannot initialize a mutex or condition variable");
        goto fail;
    }
    res = be->open(rt, cfg, &rt->rank, &rt->world);
    if (res != MFSDP_OK) {
        mf_rt_set_error(NULL, res, "%s backend: %s", be->name, rt->err);
        goto fail;
    }
    res = setup_and_greet(rt);
    if (res != MFSDP_OK)
        goto fail;
    res = be->comm_init(rt, rt->comms, rt->ncomms);
    if (res != MFSDP_OK) {
        mf_rt_set_error(NULL, res, "%s backend: cannot create communicators: %s", be->name, rt->err);
        goto fail;
    }
    if (!rt->native && !rt->synchronous) {
        res = mf_streams_start(rt);
        if (res != MFSDP_OK) {
            mf_rt_set_error(NULL, res, "%s", rt->err);
            goto fail;
        }
    }
    rt->err[0] = '\0';
    rt->magic = MF_RT_MAGIC;
    *out = rt;
    return MFSDP_OK;

fail:
    release(rt);
    return res;
}

MFSDP_API void mfsdp_destroy(mfsdp_runtime *rt)
{
    if (!mf_rt_live(rt))
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

MFSDP_API const char *mfsdp_last_error(const mfsdp_runtime *rt)
{
    return mf_rt_live(rt) ? rt->err : thread_err;
}

MFSDP_API int64_t mfsdp_rank(const mfsdp_runtime *rt)
{
    return mf_rt_live(rt) ? rt->rank : -1;
}

MFSDP_API int64_t mfsdp_world_size(const mfsdp_runtime *rt)
{
    return mf_rt_live(rt) ? rt->world : 0;
}

MFSDP_API int64_t mfsdp_coord(const mfsdp_runtime *rt, int axis)
{
    if (!mf_rt_live(rt) || axis < 0 || axis >= rt->s->mesh.naxes)
        return -1;
    return rt->coords[axis];
}

MFSDP_API int mfsdp_num_tensors(const mfsdp_runtime *rt)
{
    return mf_rt_live(rt) ? rt->nviews : 0;
}

MFSDP_API mfsdp_result mfsdp_tensor_view_get(mfsdp_runtime *rt, int index, mfsdp_tensor_view *out)
{
    mfsdp_result res = mf_rt_handle_check(rt, "mfsdp_tensor_view_get");
    if (res != MFSDP_OK)
        return res;
    if (!out || index < 0 || index >= rt->nviews)
        return mf_rt_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                               "mfsdp_tensor_view_get: tensor index %d out of range [0, %d)", index,
                               rt->nviews);
    *out = rt->views[index];
    return MFSDP_OK;
}

MFSDP_API int mfsdp_tensor_find(const mfsdp_runtime *rt, const char *name)
{
    if (!mf_rt_live(rt) || !name)
        return -1;
    for (int i = 0; i < rt->nviews; i++)
        if (strcmp(rt->views[i].name, name) == 0)
            return i;
    return -1;
}

MFSDP_API mfsdp_result mfsdp_get_stats(const mfsdp_runtime *crt, mfsdp_stats *out)
{
    mfsdp_result res = mf_rt_handle_check(crt, "mfsdp_get_stats");
    if (res != MFSDP_OK)
        return res;
    if (!out)
        return mf_rt_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_get_stats: out is NULL");
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
