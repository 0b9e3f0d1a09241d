/*
 * gm_exec: graph instances -- cudaGraphInstantiate, cudaGraphLaunch,
 * cudaGraphExecUpdate and the destroys.
 *
 * An instance holds its own copy of the graph's nodes (sharing the work,
 * gm_box, by reference), so the graph may be destroyed after instantiation. A
 * launch snapshots the instance's nodes again, so an update or a destroy while
 * a launch is pending changes only later launches, as in CUDA. The nodes of
 * one launch run on the launch stream's worker, one at a time, in a
 * topological order drawn from the seed and the launch's number.
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

static cudaError_t launch_run(void *p, char *err, size_t len)
{
    gm_launch *l = p;
    gm_graph *g = &l->g;
    int *left = calloc((size_t)(g->n ? g->n : 1), sizeof *left);
    char *done = calloc((size_t)(g->n ? g->n : 1), 1);
    int *ready = malloc((size_t)(g->n ? g->n : 1) * sizeof *ready);
    if (!left || !done || !ready) {
        free(left), free(done), free(ready);
        snprintf(err, len, "graph launch: out of host memory");
        return cudaErrorMemoryAllocation;
    }
    int nready = 0;
    for (int i = 0; i < g->n; i++)
        if ((left[i] = g->nodes[i].ndeps) == 0)
            ready[nready++] = i;
    cudaError_t e = cudaSuccess;
    for (int step = 0; step < g->n && e == cudaSuccess; step++) {
        /* A node with all its dependencies done, drawn from the seed. */
        uint64_t r = gm_hash(gm_seed() ^ gm_hash(l->number * 0x1000193ull + (uint64_t)step));
        int k = (int)(r % (uint64_t)nready);
        int v = ready[k];
        ready[k] = ready[--nready];
        gm_box *b = g->nodes[v].box;
        unsigned us = gm_delay_us(r);
        if (us && (r & 2))
            usleep(us);
        if (b->fn)
            e = b->fn(b->arg, err, len);
        done[v] = 1;
        for (int i = 0; i < g->n; i++)
            for (int j = 0; j < g->nodes[i].ndeps; j++)
                if (g->nodes[i].deps[j] == v && --left[i] == 0)
                    ready[nready++] = i;
    }
    free(left), free(done), free(ready);
    return e;
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
