/*
 * gm_exec: graph instances -- cudaGraphInstantiate, cudaGraphLaunch,
 * cudaGraphExecUpdate and the destroys.
 *
 * An instance holds its own copy of the graph's nodes (sharing the work,
 * gm_box, by reference), so the graph may be destroyed after instantiation. A
 * launch snapshots the instance's nodes again, so an update or a destroy while
 * a launch is pending changes only later launches, as in CUDA. The nodes of
 * one launch run concurrently, as independent branches do on a GPU: the
 * launch stream's worker and up to (nodes - 1) helper threads of that launch,
 * each taking a ready node drawn from the seed and the launch's number, after
 * a seeded delay. Invariants: a node starts only after all its dependencies
 * finished; a helper is started only while more nodes are ready than threads
 * are free, so every ready node gets a thread (a node blocking until an
 * independent branch runs, e.g. a collective, cannot deadlock) and a chain
 * starts none; the launch (its stream item) completes only when no node
 * runs any more; after a node fails no further node starts and the first
 * failure is the launch's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gm_internal.h"

typedef struct gm_exec {
    gm_graph g;
    gm_stream *last_s;   /* the previous launch, ordered before the next */
    uint64_t last_seq;
} gm_exec;

typedef struct gm_launch {
    gm_graph g;
    uint64_t number;
} gm_launch;

static gm_set gm_exec_set;
static uint64_t gm_launches;

/* Copies src's nodes into dst (empty), sharing the work. */
static int graph_copy(gm_graph *dst, const gm_graph *src)
{
    dst->nodes = calloc((size_t)(src->n ? src->n : 1), sizeof *dst->nodes);
    if (!dst->nodes)
        return -1;
    dst->cap = src->n;
    for (int i = 0; i < src->n; i++) {
        const gm_node *s = &src->nodes[i];
        gm_node *d = &dst->nodes[i];
        d->deps = malloc((size_t)(s->ndeps ? s->ndeps : 1) * sizeof *d->deps);
        if (!d->deps)
            return -1;
        memcpy(d->deps, s->deps, (size_t)s->ndeps * sizeof *d->deps);
        d->ndeps = s->ndeps;
        d->box = s->box;
        __atomic_add_fetch(&s->box->refs, 1, __ATOMIC_ACQ_REL);
        dst->n = i + 1;
    }
    return 0;
}

/* One launch's run: the shared state of its executor threads (mu guards all
 * below it). A node is ready once all its dependencies finished; nready
 * ready nodes wait in ready[], inflight run now, nthreads threads exist (the
 * stream's worker included). */
typedef struct gm_run {
    const gm_graph *g;
    uint64_t number;
    int device;
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* a node became ready, or the run ended */
    int *left;                     /* unfinished dependencies per node */
    int *ready;
    int nready, inflight, ndone, nthreads;
    uint64_t picks;                /* nodes started, for the seeded draw */
    pthread_t *helpers;            /* nthreads - 1 of them */
    cudaError_t e;                 /* the first node's failure */
    char err[512];
} gm_run;

static void *run_helper(void *p);

/* Over when every node finished, or a node failed and none runs. */
static int run_over(const gm_run *r)
{
    return r->ndone == r->g->n || (r->e != cudaSuccess && r->inflight == 0);
}

/* Gives every ready node a thread that is not running a node, spawning
 * helpers as needed: at most one thread per node, so a node that blocks until
 * a node of an independent branch has run can never starve it (r->mu held). */
static void run_staff(gm_run *r)
{
    while (r->nready > r->nthreads - r->inflight && r->nthreads < r->g->n) {
        if (pthread_create(&r->helpers[r->nthreads - 1], NULL, run_helper, r) != 0) {
            if (r->e == cudaSuccess) {
                r->e = cudaErrorMemoryAllocation;
                snprintf(r->err, sizeof r->err, "graph launch: cannot start an executor thread");
            }
            break;
        }
        r->nthreads++;
    }
    pthread_cond_broadcast(&r->cv);
}

/* Runs ready nodes, drawn from the seed among the ready ones, until the run
 * is over (each node after a seeded delay, outside the lock). */
static void run_loop(gm_run *r)
{
    const gm_graph *g = r->g;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!run_over(r) && (r->nready == 0 || r->e != cudaSuccess))
            pthread_cond_wait(&r->cv, &r->mu);
        if (run_over(r))
            break;
        uint64_t h = gm_hash(gm_seed() ^ gm_hash(r->number * 0x1000193ull + r->picks++));
        int k = (int)(h % (uint64_t)r->nready);
        int v = r->ready[k];
        r->ready[k] = r->ready[--r->nready];
        r->inflight++;
        pthread_mutex_unlock(&r->mu);
        gm_box *b = g->nodes[v].box;
        unsigned us = gm_delay_us(h);
        if (us && (h & 2))
            usleep(us);
        cudaError_t e = cudaSuccess;
        char err[512] = "";
        if (b->fn)
            e = b->fn(b->arg, err, sizeof err);
        pthread_mutex_lock(&r->mu);
        r->inflight--;
        r->ndone++;
        if (e != cudaSuccess && r->e == cudaSuccess) {
            r->e = e;
            snprintf(r->err, sizeof r->err, "%s", err);
        }
        for (int i = 0; i < g->n; i++)
            for (int j = 0; j < g->nodes[i].ndeps; j++)
                if (g->nodes[i].deps[j] == v && --r->left[i] == 0)
                    r->ready[r->nready++] = i;
        if (run_over(r))
            pthread_cond_broadcast(&r->cv);
        else if (r->e == cudaSuccess)
            run_staff(r);
    }
    pthread_mutex_unlock(&r->mu);
}

static void *run_helper(void *p)
{
    gm_run *r = p;
    gm_thread()->device = r->device; /* work runs "on" the launch's device */
    run_loop(r);
    return NULL;
}

/* Runs the launch's nodes concurrently as on a GPU: the stream's worker and
 * helper threads (started only while more nodes are ready than threads are
 * free) take ready nodes; the launch completes when every node finished or,
 * after a failure, when the nodes already running finished. */
static cudaError_t launch_run(void *p, char *err, size_t len)
{
    gm_launch *l = p;
    gm_graph *g = &l->g;
    size_t n = (size_t)(g->n ? g->n : 1);
    gm_run r = {.g = g, .number = l->number, .device = gm_thread()->device, .nthreads = 1};
    r.left = calloc(n, sizeof *r.left);
    r.ready = malloc(n * sizeof *r.ready);
    r.helpers = malloc(n * sizeof *r.helpers);
    if (!r.left || !r.ready || !r.helpers) {
        free(r.left), free(r.ready), free(r.helpers);
        snprintf(err, len, "graph launch: out of host memory");
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    for (int i = 0; i < g->n; i++)
        if ((r.left[i] = g->nodes[i].ndeps) == 0)
            r.ready[r.nready++] = i;
    pthread_mutex_lock(&r.mu);
    run_staff(&r);
    pthread_mutex_unlock(&r.mu);
    run_loop(&r);
    for (int i = 0; i < r.nthreads - 1; i++)
        pthread_join(r.helpers[i], NULL);
    if (r.e != cudaSuccess)
        snprintf(err, len, "%s", r.err);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
    free(r.left), free(r.ready), free(r.helpers);
    return r.e;
}

static void launch_free(void *p)
{
    gm_launch *l = p;
    gm_graph_clear(&l->g);
    free(l);
}

static cudaError_t graph_lookup_locked(cudaGraph_t h, const char *call, gm_graph **out)
{
    if (!gm_set_has(&gm_graph_set, h)) {
        gm_violation("%s: %p is not a graph (never made, or destroyed)", call, (void *)h);
        return cudaErrorInvalidValue;
    }
    *out = (gm_graph *)h;
    return cudaSuccess;
}

static cudaError_t exec_lookup_locked(cudaGraphExec_t h, const char *call, gm_exec **out)
{
    if (!gm_set_has(&gm_exec_set, h)) {
        gm_violation("%s: %p is not a graph instance (never made, or destroyed)", call, (void *)h);
        return cudaErrorInvalidValue;
    }
    *out = (gm_exec *)h;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t graph, unsigned long long flags)
{
    gm_init();
    (void)flags;
    if (!out)
        return gm_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&gm_g.mu);
    gm_graph *g = NULL;
    cudaError_t e = graph_lookup_locked(graph, "cudaGraphInstantiate", &g);
    gm_exec *x = NULL;
    if (e == cudaSuccess && !(x = calloc(1, sizeof *x)))
        e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess && graph_copy(&x->g, g) != 0) {
        gm_graph_clear(&x->g);
        free(x);
        e = cudaErrorMemoryAllocation;
    }
    if (e == cudaSuccess) {
        gm_set_add(&gm_exec_set, x);
        *out = (cudaGraphExec_t)x;
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t h, cudaStream_t sh)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_exec *x = NULL;
    gm_stream *s = NULL;
    gm_launch *l = NULL;
    cudaError_t e = exec_lookup_locked(h, "cudaGraphLaunch", &x);
    if (e == cudaSuccess)
        e = gm_stream_resolve_locked(sh, &s);
    if (e == cudaSuccess)
        e = gm_sticky_locked(s->device);
    if (e == cudaSuccess && !(l = calloc(1, sizeof *l)))
        e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess && graph_copy(&l->g, &x->g) != 0)
        e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) {
        l->number = ++gm_launches;
        char what[GM_WHAT];
        snprintf(what, sizeof what, "cudaGraphLaunch(%p, %d nodes, launch %llu)", (void *)h, l->g.n,
                 (unsigned long long)l->number);
        if (s->cap) {
            e = gm_capture_add_locked(s, what, launch_run, l, launch_free);
        } else if ((e = gm_capture_check_legacy_locked(s, "cudaGraphLaunch")) == cudaSuccess) {
            gm_dep prev = {x->last_s, x->last_seq};
            uint64_t seq = 0;
            e = gm_submit_locked(s, what, launch_run, l, launch_free, &prev, x->last_s ? 1 : 0, &seq);
            if (e == cudaSuccess)
                x->last_s = s, x->last_seq = seq;
        }
        if (e == cudaSuccess)
            l = NULL;
    }
    if (l)
        launch_free(l);
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

/* Same topology and the same kind of work node by node; then the instance
 * takes the graph's work (parameters). */
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t h, cudaGraph_t graph, cudaGraphExecUpdateResultInfo *info)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_exec *x = NULL;
    gm_graph *g = NULL;
    cudaError_t e = exec_lookup_locked(h, "cudaGraphExecUpdate", &x);
    if (e == cudaSuccess)
        e = graph_lookup_locked(graph, "cudaGraphExecUpdate", &g);
    enum cudaGraphExecUpdateResult res = cudaGraphExecUpdateSuccess;
    if (e == cudaSuccess) {
        if (g->n != x->g.n)
            res = cudaGraphExecUpdateErrorTopologyChanged;
        for (int i = 0; i < g->n && res == cudaGraphExecUpdateSuccess; i++) {
            const gm_node *a = &g->nodes[i], *b = &x->g.nodes[i];
            if (a->ndeps != b->ndeps || memcmp(a->deps, b->deps, (size_t)a->ndeps * sizeof *a->deps) != 0)
                res = cudaGraphExecUpdateErrorTopologyChanged;
            else if (a->box->fn != b->box->fn)
                res = cudaGraphExecUpdateErrorNodeTypeChanged;
        }
        if (res != cudaGraphExecUpdateSuccess) {
            e = cudaErrorGraphExecUpdateFailure;
        } else {
            for (int i = 0; i < g->n; i++) {
                __atomic_add_fetch(&g->nodes[i].box->refs, 1, __ATOMIC_ACQ_REL);
                gm_box_release_locked(x->g.nodes[i].box);
                x->g.nodes[i].box = g->nodes[i].box;
            }
        }
    }
    if (info) {
        memset(info, 0, sizeof *info);
        info->result = res;
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaGraphDestroy(cudaGraph_t h)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_graph *g = NULL;
    cudaError_t e = graph_lookup_locked(h, "cudaGraphDestroy", &g);
    if (e == cudaSuccess) {
        gm_set_del(&gm_graph_set, g);
        gm_graph_clear(g);
        free(g);
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t h)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_exec *x = NULL;
    cudaError_t e = exec_lookup_locked(h, "cudaGraphExecDestroy", &x);
    if (e == cudaSuccess) {
        gm_set_del(&gm_exec_set, x);
        gm_graph_clear(&x->g);
        free(x);
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}
