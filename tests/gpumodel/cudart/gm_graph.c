/*
 * gm_graph: stream capture and CUDA graphs.
 *
 * A capture records work as nodes of a DAG: a node depends on its stream's
 * frontier (cap_deps) and becomes that stream's frontier. An event recorded in
 * a capturing stream keeps the frontier; a stream that waits on it joins the
 * capture (the fork) or takes the union (the join). cudaStreamEndCapture on
 * the origin stream fails with cudaErrorStreamCaptureUnjoined when another
 * stream's frontier is not an ancestor of the origin's.
 *
 * Prohibited calls follow cudaStreamCaptureMode: a potentially unsafe call
 * (cudaMalloc, cudaFree, synchronizations, synchronous copies) fails with
 * cudaErrorStreamCaptureUnsupported and invalidates the captures that forbid
 * it -- the thread's own non-relaxed ones and, while the thread's mode is
 * global, every other thread's global one. Work on the legacy stream while a
 * blocking stream of the device captures fails with
 * cudaErrorStreamCaptureImplicit and invalidates that capture.
 *
 * A launch of an instance runs as one item on the launch stream: its nodes run
 * one at a time in a topological order drawn from the seed and the launch, so
 * a missing edge inside a graph shows as wrong values under some seed. Two
 * launches of one instance are ordered (the second depends on the first).
 * Work (gm_box) is reference counted: a graph, its instances and launches in
 * flight share it, so destroying any of them is safe at any time.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gm_internal.h"

gm_set gm_graph_set;

void gm_nodeset_add(gm_nodeset *set, int v)
{
    for (int i = 0; i < set->n; i++)
        if (set->v[i] == v)
            return;
    if (set->n == set->cap) {
        int ncap = set->cap ? set->cap * 2 : 4;
        int *nv = realloc(set->v, (size_t)ncap * sizeof *nv);
        if (!nv)
            abort();
        set->v = nv;
        set->cap = ncap;
    }
    set->v[set->n++] = v;
}

void gm_nodeset_copy(gm_nodeset *dst, const gm_nodeset *src)
{
    dst->n = 0;
    for (int i = 0; i < src->n; i++)
        gm_nodeset_add(dst, src->v[i]);
}

void gm_nodeset_free(gm_nodeset *set)
{
    free(set->v);
    set->v = NULL;
    set->n = set->cap = 0;
}

void gm_box_release_locked(gm_box *b)
{
    if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        if (b->free_arg)
            b->free_arg(b->arg);
        free(b);
    }
}

void gm_graph_clear(gm_graph *g)
{
    for (int i = 0; i < g->n; i++) {
        gm_box_release_locked(g->nodes[i].box);
        free(g->nodes[i].deps);
    }
    free(g->nodes);
    g->nodes = NULL;
    g->n = g->cap = 0;
}

gm_capture *gm_capture_find_locked(unsigned long long id)
{
    for (gm_capture *c = gm_g.captures; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

void gm_capture_invalidate_locked(gm_capture *c, const char *why)
{
    if (!c->invalidated)
        gm_violation("%s: stream capture %llu is invalidated", why, c->id);
    c->invalidated = 1;
}

cudaError_t gm_capture_add_locked(gm_stream *s, const char *what, gm_work_fn fn, void *arg,
                                  void (*free_arg)(void *))
{
    gm_capture *c = s->cap;
    if (c->invalidated)
        return cudaErrorStreamCaptureInvalidated;
    gm_graph *g = c->graph;
    if (g->n == g->cap) {
        int ncap = g->cap ? g->cap * 2 : 16;
        gm_node *nn = realloc(g->nodes, (size_t)ncap * sizeof *nn);
        if (!nn)
            return cudaErrorMemoryAllocation;
        g->nodes = nn;
        g->cap = ncap;
    }
    gm_box *b = calloc(1, sizeof *b);
    int *deps = malloc((size_t)(s->cap_deps.n ? s->cap_deps.n : 1) * sizeof *deps);
    if (!b || !deps) {
        free(b);
        free(deps);
        return cudaErrorMemoryAllocation;
    }
    b->refs = 1;
    snprintf(b->what, sizeof b->what, "%s", what ? what : "work");
    b->fn = fn, b->arg = arg, b->free_arg = free_arg;
    if (s->cap_deps.n)
        memcpy(deps, s->cap_deps.v, (size_t)s->cap_deps.n * sizeof *deps);
    g->nodes[g->n] = (gm_node){b, s->cap_deps.n, deps};
    s->cap_deps.n = 0;
    gm_nodeset_add(&s->cap_deps, g->n);
    g->n++;
    return cudaSuccess;
}

static int blocking(const gm_stream *s)
{
    return s->kind != GM_STREAM_LEGACY && !(s->flags & cudaStreamNonBlocking);
}

cudaError_t gm_capture_check_legacy_locked(gm_stream *s, const char *call)
{
    if (s->kind != GM_STREAM_LEGACY)
        return cudaSuccess;
    cudaError_t e = cudaSuccess;
    for (gm_stream *x = gm_g.streams; x; x = x->next_all)
        if (x->cap && x->device == s->device && blocking(x)) {
            char why[200];
            snprintf(why, sizeof why, "%s on the legacy stream while blocking stream %d captures", call, x->id);
            gm_capture_invalidate_locked(x->cap, why);
            e = cudaErrorStreamCaptureImplicit;
        }
    return e;
}

cudaError_t gm_capture_prohibited_locked(const char *call)
{
    gm_tls *t = gm_thread();
    if (t->mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    pthread_t me = pthread_self();
    cudaError_t e = cudaSuccess;
    for (gm_capture *c = gm_g.captures; c; c = c->next) {
        int mine = pthread_equal(c->owner, me);
        if ((mine && c->mode != cudaStreamCaptureModeRelaxed) ||
            (!mine && c->mode == cudaStreamCaptureModeGlobal && t->mode == cudaStreamCaptureModeGlobal)) {
            char why[200];
            snprintf(why, sizeof why, "%s is not permitted during a %s stream capture%s", call,
                     c->mode == cudaStreamCaptureModeGlobal ? "global" : "thread-local",
                     mine ? "" : " of another thread");
            gm_capture_invalidate_locked(c, why);
            e = cudaErrorStreamCaptureUnsupported;
        }
    }
    return e;
}

cudaError_t gm_capture_event_record_locked(gm_event *e, gm_stream *s)
{
    if (s->cap->invalidated)
        return cudaErrorStreamCaptureInvalidated;
    e->cap_id = s->cap->id;
    gm_nodeset_copy(&e->cap_nodes, &s->cap_deps);
    return cudaSuccess;
}

cudaError_t gm_capture_event_wait_locked(gm_stream *s, gm_event *e, int *handled)
{
    gm_capture *ec = e->cap_id ? gm_capture_find_locked(e->cap_id) : NULL;
    *handled = ec != NULL || s->cap != NULL;
    if (!*handled)
        return cudaSuccess;
    if (!ec) {
        gm_capture_invalidate_locked(s->cap, "cudaStreamWaitEvent of a capturing stream on an event recorded "
                                             "outside the capture");
        return cudaErrorStreamCaptureIsolation;
    }
    if (s->cap && s->cap != ec) {
        gm_capture_invalidate_locked(s->cap, "cudaStreamWaitEvent joining two captures");
        return cudaErrorStreamCaptureIsolation;
    }
    if (ec->invalidated)
        return cudaErrorStreamCaptureInvalidated;
    if (!s->cap) {
        if (s->kind == GM_STREAM_LEGACY) {
            gm_capture_invalidate_locked(ec, "the legacy stream waiting on a captured event");
            return cudaErrorStreamCaptureImplicit;
        }
        s->cap = ec; /* the fork: s joins the capture */
        gm_nodeset_copy(&s->cap_deps, &e->cap_nodes);
        return cudaSuccess;
    }
    for (int i = 0; i < e->cap_nodes.n; i++)
        gm_nodeset_add(&s->cap_deps, e->cap_nodes.v[i]);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t sh, enum cudaStreamCaptureMode mode)
{
    gm_init();
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return gm_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(sh, &s);
    if (e == cudaSuccess && s->kind == GM_STREAM_LEGACY) {
        gm_violation("cudaStreamBeginCapture: the legacy default stream cannot be captured");
        e = cudaErrorStreamCaptureUnsupported;
    } else if (e == cudaSuccess && s->cap) {
        e = cudaErrorIllegalState;
    }
    gm_capture *c = NULL;
    gm_graph *g = NULL;
    if (e == cudaSuccess && (!(c = calloc(1, sizeof *c)) || !(g = calloc(1, sizeof *g)))) {
        free(c);
        e = cudaErrorMemoryAllocation;
    }
    if (e == cudaSuccess) {
        c->id = gm_g.next_capture_id++;
        c->mode = mode;
        c->owner = pthread_self();
        c->origin = s;
        c->active = 1;
        c->graph = g;
        c->next = gm_g.captures;
        gm_g.captures = c;
        s->cap = c;
        s->cap_deps.n = 0;
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

/* 1 when every other stream of c has joined back into s's frontier. */
static int joined_locked(gm_capture *c, gm_stream *s, int *unjoined_id)
{
    gm_graph *g = c->graph;
    char *anc = calloc((size_t)(g->n ? g->n : 1), 1);
    int *stack = malloc((size_t)(g->n ? g->n : 1) * sizeof *stack);
    int sp = 0, ok = 1;
    if (!anc || !stack)
        abort();
    for (int i = 0; i < s->cap_deps.n; i++)
        if (!anc[s->cap_deps.v[i]])
            anc[s->cap_deps.v[i]] = 1, stack[sp++] = s->cap_deps.v[i];
    while (sp > 0) {
        const gm_node *nd = &g->nodes[stack[--sp]];
        for (int j = 0; j < nd->ndeps; j++)
            if (!anc[nd->deps[j]])
                anc[nd->deps[j]] = 1, stack[sp++] = nd->deps[j];
    }
    for (gm_stream *x = gm_g.streams; x && ok; x = x->next_all)
        if (x->cap == c && x != s)
            for (int i = 0; i < x->cap_deps.n; i++)
                if (!anc[x->cap_deps.v[i]]) {
                    ok = 0;
                    *unjoined_id = x->id;
                }
    free(anc);
    free(stack);
    return ok;
}

static void capture_end_locked(gm_capture *c)
{
    for (gm_stream *x = gm_g.streams; x; x = x->next_all)
        if (x->cap == c) {
            x->cap = NULL;
            gm_nodeset_free(&x->cap_deps);
        }
    for (gm_capture **pp = &gm_g.captures; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    free(c);
}

cudaError_t cudaStreamEndCapture(cudaStream_t sh, cudaGraph_t *out)
{
    gm_init();
    if (!out)
        return gm_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(sh, &s);
    gm_capture *c = e == cudaSuccess ? s->cap : NULL;
    if (e == cudaSuccess && !c)
        e = cudaErrorIllegalState;
    else if (e == cudaSuccess && c->origin != s)
        e = cudaErrorStreamCaptureUnmatched;
    else if (e == cudaSuccess && c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->owner, pthread_self()))
        e = cudaErrorStreamCaptureWrongThread;
    if (e == cudaSuccess) {
        gm_graph *g = c->graph;
        int unjoined = -1;
        *out = NULL;
        if (c->invalidated) {
            e = cudaErrorStreamCaptureInvalidated;
        } else if (!joined_locked(c, s, &unjoined)) {
            gm_violation("cudaStreamEndCapture: stream %d forked from capture %llu was not joined back into "
                         "the origin stream %d",
                         unjoined, c->id, s->id);
            e = cudaErrorStreamCaptureUnjoined;
        }
        capture_end_locked(c);
        if (e == cudaSuccess) {
            gm_set_add(&gm_graph_set, g);
            *out = (cudaGraph_t)g;
        } else {
            gm_graph_clear(g);
            free(g);
        }
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t sh, enum cudaStreamCaptureStatus *status)
{
    gm_init();
    if (!status)
        return gm_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(sh, &s);
    if (e == cudaSuccess)
        *status = !s->cap ? cudaStreamCaptureStatusNone
                  : s->cap->invalidated ? cudaStreamCaptureStatusInvalidated
                                        : cudaStreamCaptureStatusActive;
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t sh, enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id, cudaGraph_t *graph,
                                     const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges, size_t *ndeps)
{
    gm_init();
    if (!status)
        return gm_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(sh, &s);
    if (e == cudaSuccess) {
        gm_capture *c = s->cap;
        *status = !c ? cudaStreamCaptureStatusNone
                  : c->invalidated ? cudaStreamCaptureStatusInvalidated
                                   : cudaStreamCaptureStatusActive;
        if (id && c)
            *id = c->id;
        if (graph)
            *graph = c ? (cudaGraph_t)c->graph : NULL;
        /* Node handles are not modelled: no dependencies are listed. */
        if (deps)
            *deps = NULL;
        if (edges)
            *edges = NULL;
        if (ndeps)
            *ndeps = 0;
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    gm_init();
    if (!mode || (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
                  *mode != cudaStreamCaptureModeRelaxed))
        return gm_ret(cudaErrorInvalidValue);
    gm_tls *t = gm_thread();
    enum cudaStreamCaptureMode old = t->mode;
    t->mode = *mode;
    *mode = old;
    return cudaSuccess;
}
