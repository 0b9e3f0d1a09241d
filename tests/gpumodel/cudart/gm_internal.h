/*
 * gm_internal: the state shared by the files of the CUDA runtime model
 * (tests/gpumodel/cudart/). Not exported.
 *
 * Invariants:
 *  - one lock, gm_g.mu, guards streams, events, captures and graphs; the
 *    memory registry has its own lock (gm_mem.c) and is never taken while
 *    waiting on a condition variable; work runs outside every lock;
 *  - each stream has its own lock `lk` (after gm_g.mu in lock order; never
 *    two stream locks at once) for its queue, `idle`, `wake_at` and the
 *    writes of done_seq: a worker's hot path takes no global lock;
 *  - wake-ups are targeted, never global: a stream's worker sleeps on its
 *    stream's `wake` (new work, destroy) or on the `done_cv` of the stream a
 *    dependency names; whoever waits for (s, seq) lowers s->wake_at to seq
 *    first, and a completion broadcasts s->done_cv only once done_seq reaches
 *    wake_at (then resets it: the woken re-check and re-register);
 *  - a stream's items complete in FIFO order: done_seq only grows, an item of
 *    sequence n is complete iff done_seq >= n; a dependency (stream, seq) is
 *    met iff that stream's done_seq >= seq;
 *  - stream structures are never freed (a dependency or an event may name one
 *    after its destroy): a destroyed stream is marked dead, its worker drains
 *    its queue and exits; its handle stays in the registry as "destroyed";
 *  - events are freed only after a quarantine of later destroys, so a stale
 *    handle is reported as destroyed rather than dereferenced.
 */
#ifndef GM_INTERNAL_H
#define GM_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "../gm_model.h"

#define GM_MAX_DEVICES 16
#define GM_WHAT 352

enum { GM_STREAM_USER, GM_STREAM_LEGACY, GM_STREAM_PER_THREAD };

typedef struct gm_dep {
    struct gm_stream *s;
    uint64_t seq;
} gm_dep;

typedef struct gm_item {
    struct gm_item *next;
    uint64_t seq;
    char what[GM_WHAT];
    gm_work_fn fn;                 /* NULL: a wait or marker */
    void *arg;
    void (*free_arg)(void *arg);
    int ndeps;
    gm_dep *deps;
} gm_item;

struct gm_capture;

typedef struct gm_nodeset {
    int n, cap;
    int *v;                        /* node indices in the capture's graph */
} gm_nodeset;

typedef struct gm_stream {
    int id;                        /* creation order, for the perturbation */
    int device;
    int kind;                      /* GM_STREAM_* */
    unsigned flags;                /* cudaStreamNonBlocking or 0 */
    int priority;
    int dead;
    uint64_t enq_seq;              /* gm_g.mu */
    uint64_t done_seq;             /* written under lk (release), read with gm_done */
    pthread_mutex_t lk;
    uint64_t wake_at;              /* lowest seq a waiter of done_cv needs; UINT64_MAX none */
    int idle;                      /* the worker sleeps on wake for new work */
    pthread_cond_t wake;           /* the worker's: new work or destroy */
    pthread_cond_t done_cv;        /* waiters for this stream's progress */
    gm_item *head, *tail;
    struct gm_capture *cap;        /* capture this stream is part of, or NULL */
    gm_nodeset cap_deps;           /* its frontier in that capture */
    struct gm_stream *next_all;
} gm_stream;

/* s->done_seq, read without s->lk (it only grows). */
static inline uint64_t gm_done(const gm_stream *s)
{
    return __atomic_load_n(&s->done_seq, __ATOMIC_ACQUIRE);
}

/* Work with its argument, shared by a graph, its instances and launches. */
typedef struct gm_box {
    int refs;
    char what[GM_WHAT];
    gm_work_fn fn;
    void *arg;
    void (*free_arg)(void *arg);
} gm_box;

typedef struct gm_node {
    gm_box *box;
    int ndeps;
    int *deps;
} gm_node;

typedef struct gm_graph {
    int n, cap;
    gm_node *nodes;
} gm_graph;

typedef struct gm_capture {
    unsigned long long id;
    enum cudaStreamCaptureMode mode;
    pthread_t owner;
    gm_stream *origin;
    int invalidated;
    int active;
    gm_graph *graph;
    struct gm_capture *next;
} gm_capture;

typedef struct gm_stamp {
    int refs;
    int done;
    double t;                      /* host seconds at completion */
} gm_stamp;

typedef struct gm_event {
    unsigned flags;
    int device;
    int dead;
    int recorded;
    gm_stream *s;                  /* last record outside capture */
    uint64_t seq;
    gm_stamp *stamp;
    unsigned long long cap_id;     /* last record was in this capture (0: not) */
    gm_nodeset cap_nodes;          /* the capturing stream's frontier then */
} gm_event;

typedef struct gm_state {
    pthread_mutex_t mu;
    int ndevices;
    int no_device;
    unsigned delay_us;
    uint64_t seed;
    long drop_wait;                /* GM_DROP_WAIT: k-th wait dropped, 0 none */
    long waits;
    int drop_per_thread;           /* GM_DROP_WAIT_PER_THREAD: count per host thread */
    int next_stream_id;
    gm_stream *streams;            /* every stream ever made */
    gm_stream *legacy[GM_MAX_DEVICES];
    cudaError_t sticky[GM_MAX_DEVICES];
    gm_capture *captures;          /* active ones */
    unsigned long long next_capture_id;
} gm_state;

extern gm_state gm_g;

typedef struct gm_tls {
    int device;
    cudaError_t last;
    enum cudaStreamCaptureMode mode;
    gm_stream *per_thread[GM_MAX_DEVICES];
    long waits;                    /* this thread's cudaStreamWaitEvent calls */
} gm_tls;

/* gm_core.c */
void gm_init(void);
gm_tls *gm_thread(void);
cudaError_t gm_ret(cudaError_t e);            /* records e as the last error */
cudaError_t gm_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t gm_hash(uint64_t x);
void gm_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double gm_now(void);

/* A set of handles (open addressing on the pointer; no locking of its own). */
typedef struct gm_set {
    size_t n, cap, used;
    const void **v;
} gm_set;
void gm_set_add(gm_set *set, const void *p);
int gm_set_has(const gm_set *set, const void *p);
void gm_set_del(gm_set *set, const void *p);

/* gm_stream.c (gm_g.mu held where the name ends in _locked) */
cudaError_t gm_stream_resolve_locked(cudaStream_t h, gm_stream **out);
cudaError_t gm_submit_locked(gm_stream *s, const char *what, gm_work_fn fn, void *arg,
                             void (*free_arg)(void *), const gm_dep *extra, int nextra, uint64_t *seq);
void gm_wait_seq_locked(gm_stream *s, uint64_t seq);
void gm_device_sync_locked(int device);
cudaError_t gm_sticky_locked(int device);
void gm_stream_sync_locked(gm_stream *s);
void gm_stream_atfork(void);

/* gm_graph.c */
cudaError_t gm_capture_add_locked(gm_stream *s, const char *what, gm_work_fn fn, void *arg,
                                  void (*free_arg)(void *));
cudaError_t gm_capture_check_legacy_locked(gm_stream *s, const char *call);
cudaError_t gm_capture_prohibited_locked(const char *call);
void gm_capture_invalidate_locked(gm_capture *c, const char *why);
void gm_box_release_locked(gm_box *b);
void gm_graph_clear(gm_graph *g);
extern gm_set gm_graph_set;   /* graphs from cudaStreamEndCapture */
cudaError_t gm_capture_event_record_locked(gm_event *e, gm_stream *s);
cudaError_t gm_capture_event_wait_locked(gm_stream *s, gm_event *e, int *handled);
gm_capture *gm_capture_find_locked(unsigned long long id);
void gm_nodeset_copy(gm_nodeset *dst, const gm_nodeset *src);
void gm_nodeset_add(gm_nodeset *set, int v);
void gm_nodeset_free(gm_nodeset *set);

/* gm_mem.c */
typedef enum { GM_MEM_NONE, GM_MEM_DEVICE, GM_MEM_HOST, GM_MEM_MANAGED } gm_mem_kind;
gm_mem_kind gm_mem_kind_of(const void *p, int *device);
void gm_mem_after_fork(void);
void gm_launch_after_fork(void);

/* gm_launch.c: what nvcc's host stubs call (declared by crt/host_runtime.h
 * for C++ only). */
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **handle);
void __cudaUnregisterFatBinary(void **handle);
void __cudaRegisterFunction(void **handle, const char *hostFun, char *deviceFun, const char *deviceName,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t smem, struct CUstream_st *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *smem, void *stream);
cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *hostFun);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t smem,
                               cudaStream_t s);

/* gm_demangle.cc */
int gm_demangle_key(const char *mangled, char *out, size_t cap);

#endif
