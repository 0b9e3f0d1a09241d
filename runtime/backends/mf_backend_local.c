/*
 * mf_backend_local: N thread-ranks in one process sharing memory. For tests
 * and for replaying a schedule on one machine.
 *
 * A group (mfsdp_local_group) is shared by the thread-ranks. It holds the
 * create-time exchange (a generation barrier carrying each rank's bytes) and
 * one communicator per (stream, axis, axis group), created by the first rank
 * that needs it and freed by the last that leaves.
 *
 * A collective is a rendezvous on its communicator. Each rank numbers its
 * collectives on a communicator (0, 1, 2, ...); collective k uses slot k % 2.
 * A rank posts its source pointer, waits until every member has posted,
 * computes its own destination by reading every member's source directly
 * (no intermediate copies), then departs and waits until every member has
 * departed, so no member's source is overwritten while a peer still reads it.
 * An all-reduce: each member reduces one chunk and writes it into every
 * member's destination (n times less arithmetic than every member reducing
 * all, and as much memory traffic as a memcpy). From MF_LOCAL_STREAM_MIN
 * bytes per destination (larger than the members' buffers can share the
 * last-level cache) the destinations are written with streaming stores
 * (mf_nt_copy.c: no read for ownership of their lines), and an
 * all-gather pushes instead of pulling: each member reads its own source
 * once and streams it into every member's destination.
 * The last rank to depart recycles the slot for collective k + 2. With two
 * slots a fast rank can already post collective k + 1 while slow ones depart
 * from k. Reductions sum in coord order, so every member computes the same
 * bits. An all-gather or reduce-scatter whose source and destination are the
 * same buffer (in place) posts a copy of its source (per-stream scratch sized
 * at create); an in-place all-reduce needs none (see local_collective).
 * Waits first yield the core a few times, then sleep (comm_wait). Eager
 * collectives (at most MF_LOCAL_EAGER bytes posted per member): each member
 * copies its source into the slot, so nobody waits for the others to depart
 * (one rendezvous instead of two, or three for an all-reduce, which every
 * member then reduces whole, summing in the same order).
 *
 * Failure: every wait is bounded by the timeout. A rank that times out
 * aborts the communicator with a message naming the ranks that never
 * arrived; every member waiting on it returns MFSDP_ERR_ABORTED with that
 * message at once. Members that disagree on a collective (kind, dtype, count)
 * all get MFSDP_ERR_MISMATCH.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "mf_base.h"
#include "mf_ckpt_stage.h"
#include "mf_cpu_kernels.h"
#include "mf_nt_copy.h"

#define MF_LOCAL_XMAX 256      /* bytes per rank in an exchange */
#define MF_LOCAL_XSPINS 64     /* yields of an exchange's wait before it sleeps */
/* Eager collectives: a member posting at most MF_LOCAL_EAGER bytes copies them
 * into the slot (groups of at most MF_LOCAL_EAGER_RANKS members). */
#ifndef MF_LOCAL_EAGER
#define MF_LOCAL_EAGER 4096
#endif
#define MF_LOCAL_EAGER_RANKS 64
/* Elements an all-reduce reduces before writing them to its peers. */
#define MF_LOCAL_PUSH 8192
/* Bytes of a collective's destination (per member) from which its members
 * write the destinations with streaming stores (local_compute): below, the
 * members' buffers fit in the last-level cache together and stay there for
 * their readers; above, writing them with ordinary stores would first read
 * every destination line from memory. */
#ifndef MF_LOCAL_STREAM_MIN
#define MF_LOCAL_STREAM_MIN ((size_t)8 << 20)
#endif
#define MF_LOCAL_MSG 512

typedef struct mf_local_slot {
    int64_t seq;               /* the collective number this slot serves */
    int64_t arrived, departed;
    const void **src;          /* per coord: the posted source */
    void **dst;                /* per coord: the posted destination */
    uint8_t *posted;           /* per coord */
    uint8_t *eager;            /* per coord: c->eager_bytes for a copy of its source */
    mf_opkind kind;            /* from the first member to arrive */
    mf_dtype dtype;
    int64_t count;
    int op;
    bool mismatch;
    char mismatch_msg[MF_LOCAL_MSG];
} mf_local_slot;

typedef struct mf_local_comm {
    int64_t n;                 /* members */
    size_t eager_bytes;        /* per member and slot; 0: no eager copies */
    int refs;                  /* runtimes using it */
    int axis;
    mf_stream stream;
    int64_t color;
    int64_t *ranks;            /* world rank per coord */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool aborted;
    char abort_msg[MF_LOCAL_MSG];
    mf_local_slot slot[2];
} mf_local_comm;

struct mfsdp_local_group {
    int64_t world;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t nattached;
    uint8_t *attached;         /* per rank */
    int64_t xgen, xarrived;    /* exchange generation and arrivals in it */
    uint8_t *xdata[2];         /* per generation parity: world * MF_LOCAL_XMAX bytes */
    uint8_t *xposted[2];       /* per generation parity: who arrived */
    bool broken;               /* an exchange timed out, or a rank aborted (local_abort);
                                  reset when everyone left */
    char broken_msg[MF_LOCAL_MSG];
    mf_local_comm **comms;     /* [MF_STREAM_COUNT * MF_MAX_AXES * world] */
    /* The helpers' world all-gather (local_allgather): posted sources. */
    const void **ag_src;       /* per rank */
    size_t *ag_bytes;          /* per rank */
    uint8_t *ag_posted;        /* per rank */
    int64_t ag_arrived, ag_departed;
    bool ag_departing;         /* every rank arrived; sources are being read */
    /* The group's first failure (the first abort), put into every later
     * abort so that every survivor's error names the root cause. */
    bool root_set;
    char root_msg[MF_LOCAL_MSG];
};

typedef struct mf_local_rank {
    mfsdp_local_group *g;
    int64_t rank;
    int ncomms;
    mf_local_comm **comms;     /* per runtime comm index */
    int64_t *seq;              /* per runtime comm index: next collective number */
    void *scratch[MF_STREAM_COUNT];
} mf_local_rank;

/* ---- groups ---- */

/* Frees the group's tables and the group (not its communicators, mutex or
 * condition variable); any table may be NULL. */
static void group_free(mfsdp_local_group *g)
{
    for (int p = 0; p < 2; p++) {
        mf_base_free(g->xdata[p]);
        mf_base_free(g->xposted[p]);
    }
    mf_base_free(g->attached);
    mf_base_free(g->comms);
    mf_base_free((void *)g->ag_src);
    mf_base_free(g->ag_bytes);
    mf_base_free(g->ag_posted);
    mf_base_free(g);
}

MFSDP_API mfsdp_result mfsdp_local_group_create(int64_t world, mfsdp_local_group **out)
{
    if (!out)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_local_group_create: out is NULL");
    *out = NULL;
    if (world < 1 || world > (1 << 20))
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_local_group_create: world %lld is out of range [1, %d]",
                                 (long long)world, 1 << 20);
    mfsdp_local_group *g = mf_base_calloc(1, sizeof *g);
    if (!g)
        return mf_base_set_error(NULL, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (local group)");
    g->world = world;
    g->attached = mf_base_calloc((size_t)world, 1);
    g->comms = mf_base_calloc((size_t)(MF_STREAM_COUNT * MF_MAX_AXES * world), sizeof *g->comms);
    g->ag_src = mf_base_calloc((size_t)world, sizeof *g->ag_src);
    g->ag_bytes = mf_base_calloc((size_t)world, sizeof *g->ag_bytes);
    g->ag_posted = mf_base_calloc((size_t)world, 1);
    for (int p = 0; p < 2; p++) {
        g->xdata[p] = mf_base_calloc((size_t)world, MF_LOCAL_XMAX);
        g->xposted[p] = mf_base_calloc((size_t)world, 1);
    }
    bool ok = g->attached && g->comms && g->xdata[0] && g->xdata[1] && g->xposted[0] &&
              g->xposted[1] && g->ag_src && g->ag_bytes && g->ag_posted;
    bool mu = ok && pthread_mutex_init(&g->mu, NULL) == 0;
    bool cv = mu && mf_base_cond_init(&g->cv) == 0;
    if (!cv) {
        if (mu)
            pthread_mutex_destroy(&g->mu);
        group_free(g);
        return mf_base_set_error(NULL, ok ? MFSDP_ERR_INTERNAL : MFSDP_ERR_OUT_OF_MEMORY,
                                 "cannot create the local group");
    }
    *out = g;
    return MFSDP_OK;
}

/* Frees a communicator's tables and the communicator (not its mutex or
 * condition variable); any table may be NULL. */
static void comm_free_tables(mf_local_comm *c)
{
    for (int k = 0; k < 2; k++) {
        mf_base_free((void *)c->slot[k].src);
        mf_base_free(c->slot[k].dst);
        mf_base_free(c->slot[k].posted);
        mf_base_free(c->slot[k].eager);
    }
    mf_base_free(c->ranks);
    mf_base_free(c);
}

static void comm_free(mf_local_comm *c)
{
    if (!c)
        return;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    comm_free_tables(c);
}

MFSDP_API void mfsdp_local_group_destroy(mfsdp_local_group *g)
{
    if (!g)
        return;
    for (int64_t i = 0; i < MF_STREAM_COUNT * MF_MAX_AXES * g->world; i++)
        comm_free(g->comms[i]);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    group_free(g);
}

/* ---- backend functions ---- */

static mfsdp_result local_open(mf_rt *rt, const mfsdp_config *cfg, int64_t *rank, int64_t *world)
{
    mfsdp_local_group *g = cfg->local_group;
    if (!g)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "config.local_group is NULL (create one with mfsdp_local_group_create)");
    if (cfg->rank < -1 || cfg->rank >= g->world)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "config.rank %lld is out of range for a local group of %lld ranks "
                                 "(or -1: the lowest rank without a runtime)",
                                 (long long)cfg->rank, (long long)g->world);
    mf_local_rank *st = mf_base_calloc(1, sizeof *st);
    if (!st)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_lock(&g->mu);
    int64_t r = cfg->rank;
    for (int64_t q = 0; r < 0 && q < g->world; q++)   /* rank -1: the lowest free one */
        if (!g->attached[q])
            r = q;
    bool taken = r < 0 || g->attached[r];
    if (!taken) {
        g->attached[r] = 1;
        g->nattached++;
    }
    pthread_mutex_unlock(&g->mu);
    if (taken) {
        mf_base_free(st);
        if (r < 0)
            return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                                     "config.rank is -1 but every rank of this local group of %lld "
                                     "already has a runtime", (long long)g->world);
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                                 "rank %lld already has a runtime on this local group", (long long)r);
    }
    st->g = g;
    st->rank = r;
    rt->be_state = st;
    *rank = r;
    *world = g->world;
    return MFSDP_OK;
}

/* Appends the world ranks whose flag is 0 to msg ("2,5"). */
static void list_missing(char *msg, size_t size, const uint8_t *flags, const int64_t *ranks,
                         int64_t n)
{
    size_t at = strlen(msg);
    const char *sep = "";
    for (int64_t i = 0; i < n && at < size; i++)
        if (!flags[i]) {
            at += (size_t)snprintf(msg + at, size - at, "%s%lld", sep,
                                   (long long)(ranks ? ranks[i] : i));
            sep = ",";
        }
}

static mfsdp_result local_exchange(mf_rt *rt, const void *mine, size_t bytes, void *all)
{
    mf_local_rank *st = rt->be_state;
    mfsdp_local_group *g = st->g;
    if (bytes > MF_LOCAL_XMAX)
        return mf_base_set_error(rt, MFSDP_ERR_INTERNAL, "exchange of %zu bytes exceeds %d", bytes,
                                 MF_LOCAL_XMAX);
    mfsdp_result res = MFSDP_OK;
    struct timespec deadline = {-1, 0};   /* set when the wait first sleeps */
    int spins = 0;
    pthread_mutex_lock(&g->mu);
    int64_t gen = g->xgen;
    uint8_t *buf = g->xdata[gen & 1];
    if (g->broken) {
        res = mf_base_set_error(rt, MFSDP_ERR_ABORTED, "%s", g->broken_msg);
        goto done;
    }
    memcpy(buf + st->rank * MF_LOCAL_XMAX, mine, bytes);
    g->xposted[gen & 1][st->rank] = 1;
    if (++g->xarrived == g->world) {
        g->xarrived = 0;
        memset(g->xposted[(gen + 1) & 1], 0, (size_t)g->world);
        g->xgen++;
        pthread_cond_broadcast(&g->cv);
    }
    /* A few yields before sleeping: after create this is the ranks'
     * agreement at a hook (engine/mf_agree.c), where peers are microseconds
     * apart and a futex hand-off per rank would cost more than the wait. */
    while (g->xgen == gen && !g->broken) {
        if (mf_base_spin_wait(&g->mu, &g->cv, MF_LOCAL_XSPINS, rt->cfg.timeout_ms, &deadline, &spins) ==
                ETIMEDOUT &&
            g->xgen == gen) {
            snprintf(g->broken_msg, sizeof g->broken_msg, "rank %lld timed out after %lld ms %s; missing ranks: ",
                     (long long)st->rank, (long long)rt->cfg.timeout_ms,
                     rt->magic == MF_RT_MAGIC ? "in the ranks' agreement at a hook (every rank must reach it)"
                                              : "waiting for every rank to create its runtime");
            list_missing(g->broken_msg, sizeof g->broken_msg, g->xposted[gen & 1], NULL, g->world);
            g->broken = true;
            pthread_cond_broadcast(&g->cv);
            res = mf_base_set_error(rt, MFSDP_ERR_TIMEOUT, "%s", g->broken_msg);
            goto done;
        }
    }
    if (g->xgen == gen) {
        res = mf_base_set_error(rt, MFSDP_ERR_ABORTED, "%s", g->broken_msg);
        goto done;
    }
    for (int64_t r = 0; r < g->world; r++)
        memcpy((uint8_t *)all + r * (int64_t)bytes, buf + r * MF_LOCAL_XMAX, bytes);
done:
    pthread_mutex_unlock(&g->mu);
    return res;
}

/* Records the group's first failure; returns the message every abort should
 * carry (the root cause). Takes g->mu. */
static void group_root(mfsdp_local_group *g, const char *why, char *out, size_t size)
{
    pthread_mutex_lock(&g->mu);
    if (!g->root_set) {
        g->root_set = true;
        snprintf(g->root_msg, sizeof g->root_msg, "%s", why);
    }
    snprintf(out, size, "%s", g->root_msg);
    pthread_mutex_unlock(&g->mu);
}

/* The helpers' world all-gather: every rank posts its source, waits until
 * all have, copies every source into `all` (rank order), then waits until
 * every rank has copied (sources stay valid until then). A timeout breaks
 * the group (like a failed create exchange) naming the missing ranks. */
static mfsdp_result local_allgather(mf_rt *rt, const void *mine, size_t bytes, void *all,
                                    char *err, size_t errlen)
{
    mf_local_rank *st = rt->be_state;
    mfsdp_local_group *g = st->g;
    mfsdp_result res = MFSDP_OK;
    struct timespec deadline = mf_base_deadline(rt->cfg.timeout_ms);
    bool posted = false;
    pthread_mutex_lock(&g->mu);
    while (g->ag_departing && !g->broken)       /* the previous call is still being read */
        if (mf_base_cond_wait(&g->cv, &g->mu, rt->cfg.timeout_ms, &deadline) == ETIMEDOUT &&
            g->ag_departing)
            break;
    if (!g->broken && !g->ag_departing) {
        g->ag_src[st->rank] = mine;
        g->ag_bytes[st->rank] = bytes;
        g->ag_posted[st->rank] = 1;
        posted = true;
        if (++g->ag_arrived == g->world) {
            g->ag_departing = true;
            pthread_cond_broadcast(&g->cv);
        }
        while (!g->ag_departing && !g->broken)
            if (mf_base_cond_wait(&g->cv, &g->mu, rt->cfg.timeout_ms, &deadline) == ETIMEDOUT &&
                !g->ag_departing && !g->broken) {
                snprintf(g->broken_msg, sizeof g->broken_msg,
                         "rank %lld timed out after %lld ms in a world all-gather (a helper's, or "
                         "the ranks' agreement at a hook: every rank must make it); missing ranks: ",
                         (long long)st->rank, (long long)rt->cfg.timeout_ms);
                list_missing(g->broken_msg, sizeof g->broken_msg, g->ag_posted, NULL, g->world);
                g->broken = true;
                pthread_cond_broadcast(&g->cv);
                res = MFSDP_ERR_TIMEOUT;
            }
    }
    if (res == MFSDP_OK && (!posted || g->broken || !g->ag_departing))
        res = g->broken ? MFSDP_ERR_ABORTED : MFSDP_ERR_TIMEOUT;
    if (res != MFSDP_OK) {
        snprintf(err, errlen, "%s", g->broken ? g->broken_msg : "a helper's world all-gather timed out");
        pthread_mutex_unlock(&g->mu);
        return res;
    }
    bool same = true;
    for (int64_t r = 0; r < g->world; r++)
        same &= g->ag_bytes[r] == bytes;
    pthread_mutex_unlock(&g->mu);
    /* Sources are stable until every rank departs. */
    for (int64_t r = 0; r < g->world && same; r++)
        memcpy((uint8_t *)all + r * (int64_t)bytes, g->ag_src[r], bytes);
    pthread_mutex_lock(&g->mu);
    if (++g->ag_departed == g->world) {
        g->ag_arrived = g->ag_departed = 0;
        g->ag_departing = false;
        memset(g->ag_posted, 0, (size_t)g->world);
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->ag_departing && !g->broken)
            mf_base_cond_wait(&g->cv, &g->mu, 0, &deadline);   /* every rank arrived: no wait is long */
    }
    pthread_mutex_unlock(&g->mu);
    if (!same) {
        snprintf(err, errlen, "ranks called a helper's world all-gather with different sizes "
                 "(every rank must call the same helpers in the same order)");
        return MFSDP_ERR_MISMATCH;
    }
    return MFSDP_OK;
}

static mf_local_comm *comm_new(const mf_rt_comm *d)
{
    mf_local_comm *c = mf_base_calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->n = d->nranks;
    c->axis = d->axis;
    c->stream = d->stream;
    c->color = d->color;
    c->ranks = mf_base_calloc((size_t)d->nranks, sizeof *c->ranks);
    c->eager_bytes = d->nranks <= MF_LOCAL_EAGER_RANKS ? MF_LOCAL_EAGER : 0;
    bool ok = c->ranks != NULL;
    for (int k = 0; k < 2 && ok; k++) {
        c->slot[k].seq = k;
        c->slot[k].src = mf_base_calloc((size_t)d->nranks, sizeof *c->slot[k].src);
        c->slot[k].dst = mf_base_calloc((size_t)d->nranks, sizeof *c->slot[k].dst);
        c->slot[k].posted = mf_base_calloc((size_t)d->nranks, 1);
        if (c->eager_bytes)
            c->slot[k].eager = mf_base_calloc((size_t)d->nranks, c->eager_bytes);
        ok = c->slot[k].src && c->slot[k].dst && c->slot[k].posted &&
             (!c->eager_bytes || c->slot[k].eager);
    }
    bool mu = ok && pthread_mutex_init(&c->mu, NULL) == 0;
    if (mu && mf_base_cond_init(&c->cv) == 0) {
        memcpy(c->ranks, d->ranks, (size_t)d->nranks * sizeof *c->ranks);
        return c;
    }
    if (mu)
        pthread_mutex_destroy(&c->mu);
    comm_free_tables(c);
    return NULL;
}

static void release_comms(mf_local_rank *st)
{
    mfsdp_local_group *g = st->g;
    pthread_mutex_lock(&g->mu);
    for (int c = 0; c < st->ncomms; c++) {
        mf_local_comm *cm = st->comms[c];
        if (!cm)
            continue;
        if (--cm->refs == 0) {
            int64_t key = ((int64_t)cm->stream * MF_MAX_AXES + cm->axis) * g->world + cm->color;
            g->comms[key] = NULL;
            comm_free(cm);
        }
        st->comms[c] = NULL;
    }
    pthread_mutex_unlock(&g->mu);
}

/* The elements of its source a member posts: count (times the group for a
 * reduce_scatter); in a whole bucket's chunked form (r->used) what it holds
 * of the source (a ragged bucket's buffers are shorter than n * count). */
static int64_t post_elems(const mf_rt_op *r)
{
    if (r->used)
        return r->src_count;
    return r->op->count * (r->op->kind == MF_OP_REDUCE_SCATTER ? r->nranks : 1);
}


static mfsdp_result local_comm_init(mf_rt *rt, const mf_rt_comm *comms, int ncomms)
{
    mf_local_rank *st = rt->be_state;
    mfsdp_local_group *g = st->g;
    st->comms = mf_base_calloc((size_t)(ncomms ? ncomms : 1), sizeof *st->comms);
    st->seq = mf_base_calloc((size_t)(ncomms ? ncomms : 1), sizeof *st->seq);
    if (!st->comms || !st->seq)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (communicators)");
    st->ncomms = ncomms;
    mfsdp_result res = MFSDP_OK;
    pthread_mutex_lock(&g->mu);
    for (int c = 0; c < ncomms; c++) {
        const mf_rt_comm *d = &comms[c];
        int64_t key = ((int64_t)d->stream * MF_MAX_AXES + d->axis) * g->world + d->color;
        if (!g->comms[key])
            g->comms[key] = comm_new(d);
        if (!g->comms[key]) {
            res = mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (communicator)");
            break;
        }
        g->comms[key]->refs++;
        st->comms[c] = g->comms[key];
    }
    pthread_mutex_unlock(&g->mu);
    if (res != MFSDP_OK)
        return res;
    /* Scratch for in-place collectives: the largest source an in-place op
     * of each stream posts. */
    size_t need[MF_STREAM_COUNT] = {0};
    for (int i = 0; i < rt->s->nops; i++) {
        const mf_rt_op *r = &rt->rops[i];
        if (r->comm < 0 || !r->overlap || r->op->kind == MF_OP_ALL_REDUCE)
            continue;
        size_t bytes = (size_t)post_elems(r) * mf_dtype_size(r->src_dtype);
        if (bytes > need[r->op->stream])
            need[r->op->stream] = bytes;
    }
    for (int s = 0; s < MF_STREAM_COUNT; s++)
        if (need[s]) {
            st->scratch[s] = mf_base_aligned_zalloc(256, need[s]);
            if (!st->scratch[s])
                return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY,
                                         "out of memory (in-place scratch, %zu bytes)", need[s]);
        }
    return MFSDP_OK;
}

static void abort_comm(mf_local_comm *c, const char *why)
{
    pthread_mutex_lock(&c->mu);
    if (!c->aborted) {
        c->aborted = true;
        snprintf(c->abort_msg, sizeof c->abort_msg, "%s", why);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* local_compute in the prefix form of a whole bucket (r->used): the same
 * sums in the same order on the used prefix of each chunk only; every
 * member zero-fills the padding tail of each chunk it writes (its own
 * destination's; under push, chunk `me` of every member's), so padding
 * stays zero and the bits equal the padded form's (whose padding sums zeros). */
static void local_compute_prefix(const mf_rt *rt, const mf_rt_op *r, const mf_local_slot *slot,
                                 int64_t n, bool eager, bool stream)
{
    const mf_op *op = r->op;
    int64_t me = r->coord, u = r->used[me], own = r->dst_count;
    int64_t div = rt->s->reduce == MF_REDUCE_AVG ? n : 1;
    size_t es = mf_dtype_size(op->dtype);
    char *dst = r->dst;
    switch (op->kind) {
    case MF_OP_ALL_GATHER:
        /* chunk i at disp[i]; its tail past used[i] (alignment, or the equal
         * form's padding: chunk i ends at disp[i+1], or at the end) zeroed */
        if (stream) {   /* push chunk `me` into every member's destination */
            int64_t end = me + 1 < n ? r->disp[me + 1] : own;
            for (int64_t k = 1; k <= n; k++) {
                char *chunk = (char *)slot->dst[(me + k) % n] + (size_t)r->disp[me] * es;
                mf_nt_copy(chunk, slot->src[me], (size_t)u * es);
                memset(chunk + (size_t)u * es, 0, (size_t)(end - r->disp[me] - u) * es);
            }
            mf_nt_copy_fence();
            break;
        }
        for (int64_t i = 0; i < n; i++) {
            char *chunk = dst + (size_t)r->disp[i] * es;
            int64_t end = i + 1 < n ? r->disp[i + 1] : own;
            memcpy(chunk, slot->src[i], (size_t)r->used[i] * es);
            memset(chunk + (size_t)r->used[i] * es, 0, (size_t)(end - r->disp[i] - r->used[i]) * es);
        }
        break;
    case MF_OP_REDUCE_SCATTER:
        mf_cpu_kernels_reduce(dst, slot->src, (int)n, r->disp[me], u, op->dtype, div);
        memset(dst + (size_t)u * es, 0, (size_t)(own - u) * es);
        break;
    case MF_OP_ALL_REDUCE: {
        /* u is every member's: they hold the same shard. Chunks of the
         * prefix as local_compute's of the whole; nobody else touches
         * [u, cnt) of this member's destination. */
        if (eager) {
            mf_cpu_kernels_reduce(dst, slot->src, (int)n, 0, u, op->dtype, div);
        } else if (stream) {
            int64_t lo = me * u / n, hi = (me + 1) * u / n;
            mf_cpu_kernels_reduce_out(slot->dst, (int)n, slot->src, (int)n, lo, hi - lo, op->dtype, div);
        } else {
            int64_t lo = me * u / n, hi = (me + 1) * u / n;
            for (int64_t b = lo; b < hi; b += MF_LOCAL_PUSH) {
                int64_t len = hi - b < MF_LOCAL_PUSH ? hi - b : MF_LOCAL_PUSH;
                size_t at = (size_t)b * es;
                mf_cpu_kernels_reduce(dst + at, slot->src, (int)n, b, len, op->dtype, div);
                for (int64_t j = 0; j < n; j++)
                    if (j != me)
                        memcpy((char *)slot->dst[j] + at, dst + at, (size_t)len * es);
            }
        }
        memset(dst + (size_t)u * es, 0, (size_t)(own - u) * es);
        break;
    }
    default:
        break;
    }
}

/* This member's part of a collective whose members all arrived (slot->src
 * and slot->dst posted): writes its destination (and, for an all-reduce,
 * its chunk of every member's). */
static void local_compute(const mf_rt *rt, const mf_rt_op *r, const mf_local_slot *slot, int64_t n,
                          bool eager)
{
    const mf_op *op = r->op;
    int64_t me = r->coord, cnt = op->count;
    int64_t div = rt->s->reduce == MF_REDUCE_AVG ? n : 1;
    size_t es = mf_dtype_size(op->dtype);
    size_t full = (size_t)(op->kind == MF_OP_ALL_GATHER ? n * cnt : cnt) * es;
    bool stream = !eager && full >= MF_LOCAL_STREAM_MIN;
    if (r->used) {   /* a whole bucket's prefix form */
        local_compute_prefix(rt, r, slot, n, eager, stream);
        return;
    }
    switch (op->kind) {
    case MF_OP_ALL_GATHER:
        if (stream) {
            /* Large: push. Member `me` reads its source once and streams it
             * into chunk `me` of every member's destination (read S, write
             * n S, no read for ownership), instead of reading all n sources
             * into its own. Peers stay until all depart. */
            for (int64_t k = 1; k <= n; k++) {
                int64_t j = (me + k) % n;
                mf_nt_copy((char *)slot->dst[j] + (size_t)(me * cnt) * es, slot->src[me],
                                   (size_t)cnt * es);
            }
            mf_nt_copy_fence();
            break;
        }
        for (int64_t i = 0; i < n; i++)
            memcpy((char *)r->dst + (size_t)(i * cnt) * es, slot->src[i], (size_t)cnt * es);
        break;
    case MF_OP_REDUCE_SCATTER:
        mf_cpu_kernels_reduce(r->dst, slot->src, (int)n, me * cnt, cnt, op->dtype, div);
        break;
    case MF_OP_ALL_REDUCE: {
        if (eager) {   /* every member reduces it all: same sums, same order */
            mf_cpu_kernels_reduce(r->dst, slot->src, (int)n, 0, cnt, op->dtype, div);
            break;
        }
        /* Each member reduces its own chunk (every chunk is reduced once,
         * so every member ends with the same bits) and writes it into
         * every member's destination, block by block while it is in
         * cache: 2 S bytes of traffic per member, like a memcpy. Nobody
         * else reads or writes chunk `me` of any source or destination
         * (in place, the block read is the block written, read first),
         * and peers stay until all depart, so no barrier is needed
         * between reducing and writing. */
        int64_t lo = me * cnt / n, hi = (me + 1) * cnt / n;
        if (stream) {
            /* Large: the same sums, streamed into every destination from a
             * cache-resident block (no read for ownership of the lines). */
            mf_cpu_kernels_reduce_out(slot->dst, (int)n, slot->src, (int)n, lo, hi - lo, op->dtype, div);
            break;
        }
        for (int64_t b = lo; b < hi; b += MF_LOCAL_PUSH) {
            int64_t len = hi - b < MF_LOCAL_PUSH ? hi - b : MF_LOCAL_PUSH;
            size_t at = (size_t)b * es;
            mf_cpu_kernels_reduce((char *)r->dst + at, slot->src, (int)n, b, len, op->dtype, div);
            for (int64_t j = 0; j < n; j++)
                if (j != me)
                    memcpy((char *)slot->dst[j] + at, (const char *)r->dst + at, (size_t)len * es);
        }
        break;
    }
    default:
        break;
    }
}

/* Number of sched_yield rounds a rendezvous wait spends before sleeping on
 * the communicator's condition variable. */
#ifndef MF_LOCAL_SPINS
#define MF_LOCAL_SPINS 64
#endif

/* One round of a rendezvous wait (c->mu held; the caller re-checks its
 * condition): mf_base_spin_wait, yielding MF_LOCAL_SPINS times (a peer about
 * to arrive runs, and nobody pays a futex wake-up) before it sleeps on c->cv. */
static int comm_wait(mf_local_comm *c, int64_t timeout_ms, struct timespec *deadline, int *spins)
{
    return mf_base_spin_wait(&c->mu, &c->cv, MF_LOCAL_SPINS, timeout_ms, deadline, spins);
}

/* A member's arrival timed out (c->mu held; released here): aborts the
 * communicator naming the ranks that never arrived, records the group's
 * root cause, and says so in err. */
static mfsdp_result local_timed_out(mf_rt *rt, mf_local_comm *c, const mf_local_slot *slot, const mf_op *op,
                                    int64_t k, char *err, size_t errlen)
{
    mf_local_rank *st = rt->be_state;
    char msg[MF_LOCAL_MSG];
    snprintf(msg, sizeof msg,
             "rank %lld timed out after %lld ms in %s on axis %s (collective #%lld of this "
             "communicator); ranks that never arrived: ",
             (long long)rt->rank, (long long)rt->cfg.timeout_ms, mf_opkind_name(op->kind),
             rt->s->mesh.axes[op->axis].name, (long long)k);
    if (slot->seq == k)
        list_missing(msg, sizeof msg, slot->posted, c->ranks, c->n);
    else
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "(the previous collective "
                 "never finished)");
    if (!c->aborted) {
        c->aborted = true;
        snprintf(c->abort_msg, sizeof c->abort_msg, "%s", msg);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    char root[MF_LOCAL_MSG];
    group_root(st->g, msg, root, sizeof root);
    snprintf(err, errlen, "%s", msg);
    return MFSDP_ERR_TIMEOUT;
}

/* The first member to arrive at slot k sets its op; a later one whose op
 * differs records the mismatch (the first message wins). c->mu held. */
static void slot_match(const mf_rt *rt, mf_local_slot *slot, const mf_op *op, int64_t k,
                       const char *axis)
{
    if (slot->arrived == 0) {
        slot->kind = op->kind;
        slot->dtype = op->dtype;
        slot->count = op->count;
        slot->op = op->id;
    } else if (slot->kind != op->kind || slot->dtype != op->dtype || slot->count != op->count) {
        if (!slot->mismatch)
            snprintf(slot->mismatch_msg, sizeof slot->mismatch_msg,
                     "collective #%lld on axis %s: rank %lld issued %s %s count %lld (op %d) "
                     "but a peer issued %s %s count %lld (op %d)",
                     (long long)k, axis, (long long)rt->rank, mf_opkind_name(op->kind),
                     mf_dtype_name(op->dtype), (long long)op->count, op->id,
                     mf_opkind_name(slot->kind), mf_dtype_name(slot->dtype),
                     (long long)slot->count, slot->op);
        slot->mismatch = true;
    }
}

/* Departs from slot k, waiting for every member (they read our source until
 * then) unless eager (they read the slot's copy, recycled only when all
 * departed); the last one recycles the slot. No abort check here: every
 * member has arrived and finishes without blocking. c->mu held. */
static mfsdp_result depart(const mf_rt *rt, mf_local_comm *c, mf_local_slot *slot, const mf_op *op,
                           int64_t k, bool eager, struct timespec *deadline, int *spins, char *err,
                           size_t errlen)
{
    if (++slot->departed == c->n) {
        slot->arrived = slot->departed = 0;
        memset(slot->posted, 0, (size_t)c->n);
        slot->mismatch = false;
        slot->seq += 2;
        pthread_cond_broadcast(&c->cv);
        return MFSDP_OK;
    }
    if (eager)
        return MFSDP_OK;
    while (slot->seq == k)
        if (comm_wait(c, rt->cfg.timeout_ms, deadline, spins) == ETIMEDOUT && slot->seq == k) {
            snprintf(err, errlen, "%s on axis %s: peers did not finish within %lld ms",
                     mf_opkind_name(op->kind), rt->s->mesh.axes[op->axis].name,
                     (long long)rt->cfg.timeout_ms);
            return MFSDP_ERR_TIMEOUT;
        }
    return MFSDP_OK;
}

static mfsdp_result local_collective(mf_rt *rt, const mf_rt_op *r, int64_t microbatch, char *err,
                                     size_t errlen)
{
    mf_local_rank *st = rt->be_state;
    mf_local_comm *c = st->comms[r->comm];
    const mf_op *op = r->op;
    int64_t k = st->seq[r->comm]++;
    mf_local_slot *slot = &c->slot[k & 1];
    int64_t me = r->coord, n = c->n;
    size_t es = mf_dtype_size(op->dtype);
    const char *axis = rt->s->mesh.axes[op->axis].name;

    const void *mine = r->src;
    int spins = 0;
    /* In place, an all-reduce needs no copy of its source: chunk `me` of
     * every source and destination is read and written by member `me` alone
     * (see below). A reduce-scatter or all-gather would overwrite what peers
     * still read. */
    size_t post_bytes = (size_t)post_elems(r) * es;
    bool eager = post_bytes <= c->eager_bytes;
    if (r->overlap && !eager && op->kind != MF_OP_ALL_REDUCE) {
        memcpy(st->scratch[op->stream], r->src, post_bytes);
        mine = st->scratch[op->stream];
    }

    mfsdp_result res = MFSDP_OK;
    struct timespec deadline = {-1, 0};   /* set by the first sleep (comm_wait) */
    pthread_mutex_lock(&c->mu);
    while (res == MFSDP_OK && slot->seq != k && !c->aborted)
        if (comm_wait(c, rt->cfg.timeout_ms, &deadline, &spins) == ETIMEDOUT &&
            slot->seq != k)
            res = MFSDP_ERR_TIMEOUT;
    if (res == MFSDP_OK && !c->aborted) {
        slot_match(rt, slot, op, k, axis);
        if (eager) {
            uint8_t *copy = slot->eager + (size_t)me * c->eager_bytes;
            memcpy(copy, r->src, post_bytes);
            mine = copy;
        }
        slot->src[me] = mine;
        slot->dst[me] = r->dst;
        slot->posted[me] = 1;
        if (++slot->arrived == n)
            pthread_cond_broadcast(&c->cv);
        while (res == MFSDP_OK && slot->arrived < n && !c->aborted)
            if (comm_wait(c, rt->cfg.timeout_ms, &deadline, &spins) == ETIMEDOUT &&
                slot->arrived < n)
                res = MFSDP_ERR_TIMEOUT;
    }
    if (res == MFSDP_ERR_TIMEOUT)
        return local_timed_out(rt, c, slot, op, k, err, errlen);   /* unlocks c->mu */
    if (slot->arrived < n || slot->seq != k) {   /* aborted before everyone arrived */
        snprintf(err, errlen, "%s on axis %s aborted: %s", mf_opkind_name(op->kind), axis,
                 c->abort_msg);
        pthread_mutex_unlock(&c->mu);
        return MFSDP_ERR_ABORTED;
    }
    bool mismatch = slot->mismatch;
    pthread_mutex_unlock(&c->mu);

    if (!mismatch)
        local_compute(rt, r, slot, n, eager);

    pthread_mutex_lock(&c->mu);
    res = depart(rt, c, slot, op, k, eager, &deadline, &spins, err, errlen);
    if (mismatch && res == MFSDP_OK) {
        snprintf(err, errlen, "%s", slot->mismatch_msg);
        res = MFSDP_ERR_MISMATCH;
    }
    pthread_mutex_unlock(&c->mu);
    (void)microbatch;
    return res;
}

static void local_abort(mf_rt *rt, const char *why)
{
    mf_local_rank *st = rt->be_state;
    if (!st || !st->comms)
        return;
    char root[MF_LOCAL_MSG];
    group_root(st->g, why, root, sizeof root);
    for (int c = 0; c < st->ncomms; c++)
        if (st->comms[c])
            abort_comm(st->comms[c], root);
    /* The world all-gather too (helpers, the ranks' agreement at a hook):
     * a peer waiting there for this rank returns at once. */
    mfsdp_local_group *g = st->g;
    pthread_mutex_lock(&g->mu);
    if (!g->broken) {
        snprintf(g->broken_msg, sizeof g->broken_msg, "%s", root);
        g->broken = true;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

static void local_close(mf_rt *rt)
{
    mf_local_rank *st = rt->be_state;
    if (!st)
        return;
    mfsdp_local_group *g = st->g;
    if (st->comms)
        release_comms(st);
    for (int s = 0; s < MF_STREAM_COUNT; s++)
        mf_base_free(st->scratch[s]);
    mf_base_free(st->comms);
    mf_base_free(st->seq);
    pthread_mutex_lock(&g->mu);
    g->attached[st->rank] = 0;
    if (--g->nattached == 0)
        g->root_set = false;   /* the next generation starts clean */
    if (g->nattached == 0 && g->broken) {
        /* Everyone left after a failed exchange: the group is usable again. */
        g->broken = false;
        g->xarrived = 0;
        memset(g->xposted[0], 0, (size_t)g->world);
        memset(g->xposted[1], 0, (size_t)g->world);
        g->ag_arrived = g->ag_departed = 0;
        g->ag_departing = false;
        memset(g->ag_posted, 0, (size_t)g->world);
    }
    pthread_mutex_unlock(&g->mu);
    mf_base_free(st);
    rt->be_state = NULL;
}

const mf_backend_vtbl mf_backend_local = {
    .name = "local",
    .caps = MF_BE_SHARED_MEMORY | MF_BE_HOST_EXCHANGE,
    .open = local_open,
    .alloc = mf_base_host_alloc,
    .free = mf_base_host_free,
    .exchange = local_exchange,
    .comm_init = local_comm_init,
    .collective = local_collective,
    .submit = NULL,
    .synchronize = NULL,
    .allgather = local_allgather,
    .stage = mf_ckpt_stage_host, /* memcpy (mf_ckpt_stage.h) */
    .abort = local_abort,
    .close = local_close,
};
