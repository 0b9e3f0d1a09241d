/*
 * mfsdp.h: the public interface of libmfsdp, the replay runtime of mfsdp
 * (docs/runtime.md). This header is the contract with trainers: a trainer on
 * the local backend includes only it. The other public headers each add one
 * part and include this one: mfsdp_mpi.h (the MPI backend), mfsdp_nccl.h (the
 * CUDA and NCCL backends), mfsdp_ckpt.h (checkpoints).
 *
 * A trainer
 *   1. loads a compiled schedule      mfsdp_schedule_load()
 *   2. creates one runtime per rank   mfsdp_create()  (local: one per thread,
 *                                      mpi: one per process, nccl: one per GPU)
 *   3. asks for views of its tensors  mfsdp_tensor_view_get()
 *   4. calls the hooks every step, in the schedule's order:
 *        mfsdp_step_begin
 *        for m in 0..M-1:
 *          for u in 0..U-1:    mfsdp_forward_pre(u, m)  ... compute ...  mfsdp_forward_post(u, m)
 *          for u in U-1..0:    mfsdp_backward_pre(u, m) ... compute ...  mfsdp_backward_post(u, m)
 *        mfsdp_step_end
 *      and after mfsdp_step_end updates its main_weight shard from the
 *      delivered gradient shard (the optimizer step);
 *   5. destroys the runtime, then the schedule.
 *
 * Every call returns an mfsdp_result. On anything but MFSDP_OK,
 * mfsdp_last_error(rt) returns a detailed message (for calls without a
 * runtime handle, mfsdp_last_error(NULL) returns the calling thread's last
 * message). A hook called out of the schedule's order returns
 * MFSDP_ERR_INVALID_USAGE naming the hook that was expected and changes
 * nothing; the trainer may then call the right one. A timeout, a backend error
 * or a peer's failure is sticky: every later hook returns it.
 *
 * Threading: one runtime is driven by one host thread at a time (the rank's
 * trainer thread). Different runtimes (thread-ranks of the local backend) are
 * independent.
 */
#ifndef MFSDP_H
#define MFSDP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MFSDP_VERSION_MAJOR 0
#define MFSDP_VERSION_MINOR 1
#define MFSDP_VERSION_PATCH 0
/* One integer for compile-time checks: 10000*major + 100*minor + patch. */
#define MFSDP_VERSION_CODE \
    (MFSDP_VERSION_MAJOR * 10000 + MFSDP_VERSION_MINOR * 100 + MFSDP_VERSION_PATCH)

/*
 * The ABI version of the configuration structs (mfsdp_config, mfsdp_nccl_config,
 * mfsdp_ckpt_save_options, mfsdp_ckpt_load_options, mfsdp_hf_options). Each
 * begins with `size` (sizeof the struct as the caller compiled it) and
 * `version` (this number); initialize one with its macro (MFSDP_CONFIG_INIT)
 * or its init function (mfsdp_config_init), which set both, then change the
 * fields you need. The library refuses, with MFSDP_ERR_INVALID_ARGUMENT, a
 * struct whose size and version it does not know: a zeroed one (never
 * initialized) or one from a newer header (docs/runtime.md, "Configuration
 * structs").
 */
#define MFSDP_ABI_VERSION 1

#if defined(MFSDP_BUILDING) && (defined(__GNUC__) || defined(__clang__))
#define MFSDP_API __attribute__((visibility("default")))
#else
#define MFSDP_API
#endif

/* ---- results ---- */

typedef enum mfsdp_result {
    MFSDP_OK = 0,
    MFSDP_ERR_INVALID_ARGUMENT = 1, /* a NULL handle, an index out of range, a bad config */
    MFSDP_ERR_INVALID_USAGE = 2,    /* a hook out of the schedule's order */
    MFSDP_ERR_LOAD = 3,             /* the schedule file is malformed or inconsistent */
    MFSDP_ERR_MISMATCH = 4,         /* ranks disagree (schedule hash, world size, collectives) */
    MFSDP_ERR_TIMEOUT = 5,          /* a wait exceeded the configured timeout */
    MFSDP_ERR_OUT_OF_MEMORY = 6,
    MFSDP_ERR_BACKEND = 7,          /* MPI, NCCL or CUDA reported an error */
    MFSDP_ERR_UNSUPPORTED = 8,      /* the backend was not built into this library */
    MFSDP_ERR_ABORTED = 9,          /* a peer failed and aborted a shared communicator */
    MFSDP_ERR_INTERNAL = 10,        /* a bug in libmfsdp */
    MFSDP_RESULT_COUNT
} mfsdp_result;

/* A static, lower-case description of a result ("timeout"); never NULL. */
MFSDP_API const char *mfsdp_result_string(mfsdp_result r);

/* The library's version string ("0.1.0"), from the library actually loaded. */
MFSDP_API const char *mfsdp_version(void);
/* The library's MFSDP_VERSION_CODE, to compare with the header's. */
MFSDP_API int mfsdp_version_code(void);

/* ---- element types (values match the schedule file's names) ---- */

typedef enum mfsdp_dtype {
    MFSDP_FP32 = 0,
    MFSDP_BF16 = 1,
    MFSDP_FP16 = 2,
} mfsdp_dtype;

/* Bytes per element; 0 for an unknown dtype. */
MFSDP_API size_t mfsdp_dtype_size(mfsdp_dtype d);
MFSDP_API const char *mfsdp_dtype_name(mfsdp_dtype d);

/* ---- schedules ---- */

typedef struct mfsdp_schedule mfsdp_schedule;

/* Loads a compiled schedule (the YAML of `mfsdpc compile`). On success *out is
 * an owned schedule; on failure *out is NULL, the result is MFSDP_ERR_LOAD
 * (or OUT_OF_MEMORY) and mfsdp_last_error(NULL) holds the located message
 * ("file:line:col: error: ..."). */
MFSDP_API mfsdp_result mfsdp_schedule_load(const char *path, mfsdp_schedule **out);
/* The same from memory; `name` is used in messages only. */
MFSDP_API mfsdp_result mfsdp_schedule_load_buffer(const char *name, const void *text, size_t len,
                                                  mfsdp_schedule **out);
/* Takes the schedule; NULL is ignored. Every runtime created from it must be
 * destroyed first (runtimes borrow their schedule). */
MFSDP_API void mfsdp_schedule_free(mfsdp_schedule *s);

/* Read-only facts about a schedule. Out-of-range indices give 0 or NULL. */
MFSDP_API int64_t mfsdp_schedule_world_size(const mfsdp_schedule *s);
MFSDP_API int mfsdp_schedule_num_axes(const mfsdp_schedule *s);
MFSDP_API const char *mfsdp_schedule_axis_name(const mfsdp_schedule *s, int axis);
MFSDP_API int64_t mfsdp_schedule_axis_size(const mfsdp_schedule *s, int axis);
MFSDP_API int64_t mfsdp_schedule_microbatches(const mfsdp_schedule *s);
MFSDP_API int mfsdp_schedule_num_units(const mfsdp_schedule *s);
MFSDP_API const char *mfsdp_schedule_unit_name(const mfsdp_schedule *s, int unit);
/* 1 when the schedule reduces gradients with `avg`, 0 with `sum`. */
MFSDP_API int mfsdp_schedule_reduce_is_avg(const mfsdp_schedule *s);
/* The SHA-256 of the schedule file (what ranks compare at create). */
MFSDP_API void mfsdp_schedule_hash(const mfsdp_schedule *s, uint8_t out[32]);
/* Bytes per rank the schedule's buffers take: its persistent region plus its
 * transient arena (the summary's allocated_bytes, `mfsdpc explain`'s peak);
 * exactly what mfsdp_create allocates for them. */
MFSDP_API int64_t mfsdp_schedule_peak_bytes(const mfsdp_schedule *s);

#define MFSDP_MAX_DIMS 8

/* One tensor of the schedule, before any runtime exists (to build a model).
 * Indices are the same as mfsdp_tensor_view_get's. */
typedef struct mfsdp_tensor_info {
    const char *name;         /* full name: unit name + "." + tensor name */
    int unit;                 /* index of the unit whose hooks bracket its compute */
    int ndims;
    int64_t dims[MFSDP_MAX_DIMS];
    int64_t numel;
    mfsdp_dtype weight_dtype;      /* of the compute weight */
    mfsdp_dtype grad_dtype;        /* of the gradient buffers */
    mfsdp_dtype main_weight_dtype; /* of the master weight */
} mfsdp_tensor_info;

MFSDP_API int mfsdp_schedule_num_tensors(const mfsdp_schedule *s);
MFSDP_API mfsdp_result mfsdp_schedule_tensor_info(const mfsdp_schedule *s, int index,
                                                  mfsdp_tensor_info *out);

/* The roles of tensor `index` placed `Whole` (docs/semantics.md §1): each such
 * role keeps the tensor entire on one owner (the ranks of one shard), so on
 * an owner its view's shard is the whole tensor (shard_offset 0, shard_count
 * numel) and elsewhere empty. MFSDP_WHOLE_GRAD | MFSDP_WHOLE_MAIN_WEIGHT, 0
 * when neither is (or for a bad index). */
#define MFSDP_WHOLE_GRAD 1
#define MFSDP_WHOLE_MAIN_WEIGHT 2
MFSDP_API int mfsdp_schedule_tensor_whole(const mfsdp_schedule *s, int index);

/* ---- backends and configuration ---- */

typedef enum mfsdp_backend {
    MFSDP_BACKEND_LOCAL = 1, /* N thread-ranks in one process sharing memory */
    MFSDP_BACKEND_MPI = 2,   /* one process per rank; see mfsdp_mpi.h */
    MFSDP_BACKEND_NCCL = 3,  /* one process per GPU (reserved for the CUDA build) */
    MFSDP_BACKEND_CUDA_LOCAL = 4, /* thread-ranks on one GPU (CUDA build; mfsdp_nccl.h) */
} mfsdp_backend;

/* 1 when this library was built with the backend, else 0. */
MFSDP_API int mfsdp_backend_available(mfsdp_backend b);

/*
 * A group of thread-ranks of the local backend: create one with the world size,
 * hand it to every thread-rank's mfsdp_create(), destroy it after every
 * runtime created on it has been destroyed. One generation of runtimes at a
 * time: create the next set only after the previous set is destroyed.
 */
typedef struct mfsdp_local_group mfsdp_local_group;
MFSDP_API mfsdp_result mfsdp_local_group_create(int64_t world, mfsdp_local_group **out);
MFSDP_API void mfsdp_local_group_destroy(mfsdp_local_group *g);

/* Config flags. */
enum {
    /* Execute every op on the calling thread at issue, in issue order (no
     * stream threads). Slower; for debugging a schedule or a trainer. */
    MFSDP_FLAG_SYNCHRONOUS = 1u << 0,
    /* Check mode (CPU backends; also turned on by MFSDP_CHECK=1 in the
     * environment, no rebuild needed): every weight and grad_local outside
     * its window holds a signalling-NaN pattern, so a read outside a window
     * gives NaN; backward_post refuses a grad_local not completely
     * overwritten this microbatch (naming the tensor and the first bad
     * element); a hook refuses when the trainer wrote into a weight, or into
     * any buffer outside its window. Implies MFSDP_FLAG_SYNCHRONOUS; costs a
     * copy of every weight and grad_local and a few passes over them per
     * hook (docs/runtime.md, "Check mode"). Ignored by GPU backends. */
    MFSDP_FLAG_CHECK = 1u << 1,
    /* CPU offload of the master weights (FSDP2's CPUOffloadPolicy): on a GPU
     * backend (nccl, cuda-local) every main_weight buffer lives in pinned,
     * mapped host memory (a second allocation, mfsdp_offload_host_bytes) and
     * the delivered gradient is copied into a pinned host mirror at
     * mfsdp_step_end, which then returns when the copy is done; the
     * main_weight and grad views are host pointers, so the optimizer and its
     * state run on the CPU. The device arena keeps the plan's size. A
     * schedule with a collective on a main_weight buffer is refused at
     * mfsdp_create (MFSDP_ERR_UNSUPPORTED, naming the op;
     * mfsdp_schedule_offload_op). On the CPU backends (local, mpi) it is
     * accepted and a no-op: every buffer is host memory already
     * (mfsdp_offload_active() is 0, mfsdp_offload_status() says why;
     * docs/runtime.md §6). */
    MFSDP_FLAG_OFFLOAD_MAIN = 1u << 2,
};

typedef struct mfsdp_config {
    size_t size;               /* sizeof(mfsdp_config), set by the initializers */
    uint32_t version;          /* MFSDP_ABI_VERSION, set by the initializers */
    mfsdp_backend backend;
    int64_t rank;              /* world rank of this runtime, or -1 (the default):
                                  local, cuda-local: the lowest rank of the group
                                    without a runtime, in the order the creates
                                    attach (read it back with mfsdp_rank());
                                  mpi: the rank in the communicator (an explicit
                                    rank must equal it);
                                  nccl: the rank in world_comm, 0 for a world of
                                    one; with a unique id it must be given */
    int64_t timeout_ms;        /* limit of every blocking wait (peers, events,
                                  streams); 0 = wait forever. Default 600000. */
    uint32_t flags;            /* MFSDP_FLAG_* */
    mfsdp_local_group *local_group; /* local backend: the shared group */
    void *mpi_comm;            /* mpi backend: pointer to an MPI_Comm spanning
                                  exactly the mesh's ranks (mfsdp_mpi.h);
                                  borrowed, the comm is duplicated */
    void *backend_config;      /* backend-specific extension (e.g. NCCL's);
                                  NULL for local and mpi */
} mfsdp_config;

/* The defaults: local backend, rank -1, timeout 600000 ms, no flags.
 * `mfsdp_config cfg = MFSDP_CONFIG_INIT;` or mfsdp_config_init(&cfg). */
#define MFSDP_CONFIG_INIT \
    { sizeof(mfsdp_config), MFSDP_ABI_VERSION, MFSDP_BACKEND_LOCAL, -1, 600000, 0u, NULL, NULL, NULL }
/* Fills cfg with MFSDP_CONFIG_INIT. */
MFSDP_API void mfsdp_config_init(mfsdp_config *cfg);

/* ---- runtimes ---- */

typedef struct mfsdp_runtime mfsdp_runtime;

/*
 * Creates this rank's runtime: checks the config, allocates every buffer the
 * schedule names (zero-filled, through the backend: host memory on CPUs),
 * exchanges the schedule hash with every rank of the world and builds one
 * communicator per axis group per stream. Collective over the world: every
 * rank must call it. A rank whose schedule differs makes create return
 * MFSDP_ERR_MISMATCH on every rank, with a message naming the ranks that
 * differ. `s` is borrowed and must outlive the runtime. On failure *out is
 * NULL and mfsdp_last_error(NULL) holds the message.
 */
MFSDP_API mfsdp_result mfsdp_create(const mfsdp_schedule *s, const mfsdp_config *cfg,
                                    mfsdp_runtime **out);
/* Takes the runtime; NULL is ignored. Stops the stream threads; if ops are
 * still in flight (after an error), the communicators are aborted so peers
 * return instead of waiting. */
MFSDP_API void mfsdp_destroy(mfsdp_runtime *rt);

/* The detailed message of the last failed call on rt (NULL: of the calling
 * thread's last failed handle-less call, such as load or create). Borrowed,
 * valid until the next call on the same handle; never NULL. */
MFSDP_API const char *mfsdp_last_error(const mfsdp_runtime *rt);

/* Bytes this rank allocated for the schedule's buffers: one block, the
 * persistent region then the transient arena (docs/runtime.md). */
MFSDP_API int64_t mfsdp_allocated_bytes(const mfsdp_runtime *rt);
/* MFSDP_FLAG_OFFLOAD_MAIN: 1 when this runtime keeps main_weight and the
 * delivered gradient's mirror in pinned host memory (a GPU backend with the
 * flag), else 0 (no flag, or a CPU backend, where it is a no-op). */
MFSDP_API int mfsdp_offload_active(const mfsdp_runtime *rt);
/* One sentence on the offload: not requested; inactive and why (the
 * backend keeps every buffer in host memory already); or active, with its
 * bytes. Static or owned by rt, valid until mfsdp_destroy; never NULL. */
MFSDP_API const char *mfsdp_offload_status(const mfsdp_runtime *rt);
/* Bytes of pinned host memory allocated for the offload (main_weight plus
 * the gradient mirror, each buffer aligned like the arena's); 0 when
 * inactive. Not part of mfsdp_allocated_bytes (the arena, the plan). */
MFSDP_API int64_t mfsdp_offload_host_bytes(const mfsdp_runtime *rt);
/* The index of the first op of the schedule that runs a collective on a
 * main_weight buffer (NCCL needs device memory, so MFSDP_FLAG_OFFLOAD_MAIN
 * refuses the schedule on a GPU backend), or -1 when every access to a
 * main_weight buffer is a kernel or a copy (every schedule mfsdpc compiles:
 * its first transition casts from main_weight). */
MFSDP_API int mfsdp_schedule_offload_op(const mfsdp_schedule *s);
MFSDP_API int64_t mfsdp_rank(const mfsdp_runtime *rt);
MFSDP_API int64_t mfsdp_world_size(const mfsdp_runtime *rt);
/* This rank's coordinate on mesh axis `axis` (-1 when out of range). */
MFSDP_API int64_t mfsdp_coord(const mfsdp_runtime *rt, int axis);

/* ---- views ---- */

/*
 * Where one tensor's data lives for this rank. Pointers are into the
 * runtime's buffers (host memory for local and mpi, device memory for nccl)
 * and stay valid until mfsdp_destroy.
 *
 *  weight      the whole tensor in the unsharded compute weight: read it
 *              between forward_pre(u) and forward_post(u), and between
 *              backward_pre(u) and backward_post(u), of its unit u.
 *  grad_local  the whole tensor in this microbatch's local gradient: write
 *              it (overwrite, do not add) between backward_pre(u) and
 *              backward_post(u); the runtime accumulates across microbatches.
 *  main_weight this rank's shard of the fp32 master weight: elements
 *              [shard_offset, shard_offset + shard_count) of the tensor
 *              (flattened, row-major). Write the initial weights between
 *              mfsdp_create and the first mfsdp_step_begin (create zero-fills
 *              it; mfsdp_main_weight_scatter does it from a full tensor);
 *              update it after each mfsdp_step_end (the optimizer step),
 *              never inside a step.
 *  grad        the delivered gradient for the same elements, valid after
 *              mfsdp_step_end until the next step's first backward_post.
 * shard_count is 0 (and main_weight and grad are NULL) when this rank holds
 * none of the tensor -- common for small tensors on many ranks, so loop
 * `for (i = 0; i < shard_count; i++)` and never dereference them otherwise;
 * with a replicated main_weight every rank holds all of it.
 */
typedef struct mfsdp_tensor_view {
    const char *name;         /* full name: unit name + "." + tensor name */
    int unit;                 /* index of the unit whose hooks bracket its compute */
    int ndims;
    int64_t dims[MFSDP_MAX_DIMS];
    int64_t numel;            /* elements of the whole tensor */
    void *weight;             /* numel elements of weight_dtype */
    mfsdp_dtype weight_dtype;
    void *grad_local;         /* numel elements of grad_local_dtype */
    mfsdp_dtype grad_local_dtype;
    void *main_weight;        /* shard_count elements of main_weight_dtype */
    mfsdp_dtype main_weight_dtype;
    void *grad;               /* shard_count elements of grad_dtype */
    mfsdp_dtype grad_dtype;
    int64_t shard_offset;     /* first tensor-local element of this rank's shard */
    int64_t shard_count;      /* elements in this rank's shard */
} mfsdp_tensor_view;

MFSDP_API int mfsdp_num_tensors(const mfsdp_runtime *rt);
/* Copies tensor `index`'s view into *out. */
MFSDP_API mfsdp_result mfsdp_tensor_view_get(mfsdp_runtime *rt, int index, mfsdp_tensor_view *out);
/* Index of the tensor with this full name, or -1. */
MFSDP_API int mfsdp_tensor_find(const mfsdp_runtime *rt, const char *name);

/* ---- hooks (see the call order at the top) ---- */

MFSDP_API mfsdp_result mfsdp_step_begin(mfsdp_runtime *rt);
/* Returns when the unit's unsharded weights are ready for compute (CPU
 * backends; on GPUs, when the compute stream has been made to wait). */
MFSDP_API mfsdp_result mfsdp_forward_pre(mfsdp_runtime *rt, int unit, int64_t microbatch);
MFSDP_API mfsdp_result mfsdp_forward_post(mfsdp_runtime *rt, int unit, int64_t microbatch);
MFSDP_API mfsdp_result mfsdp_backward_pre(mfsdp_runtime *rt, int unit, int64_t microbatch);
/* Call after the unit's grad_local has been written for this microbatch. */
MFSDP_API mfsdp_result mfsdp_backward_post(mfsdp_runtime *rt, int unit, int64_t microbatch);
/* Issues the step's last ops. On CPU backends it returns when every op of the
 * step has completed, so the delivered gradient may be read at once. A step
 * may end early, after backward_post(unit 0, microbatch m - 1) for any
 * 1 <= m < M (a short step: the end of an epoch or a data shard); the
 * delivered gradient is then the sum over the m microbatches run (scale each
 * microbatch's loss by 1/m for their mean), averaged over ranks under
 * `reduce avg`. */
MFSDP_API mfsdp_result mfsdp_step_end(mfsdp_runtime *rt);
/* A forward-only (evaluation) pass between steps: after step_end (or before
 * the first step_begin), call eval_forward_pre/post for units 0..U-1 in
 * order. Unit u's unsharded weights (the same views as in training) are the
 * current main_weight between its pre and post; no gradient buffer is
 * touched. After any eval_forward_post a new pass may start at unit 0, or a
 * step may begin. A schedule compiled before format 4 has no evaluation
 * program: these return MFSDP_ERR_INVALID_USAGE (recompile it). */
MFSDP_API mfsdp_result mfsdp_eval_forward_pre(mfsdp_runtime *rt, int unit);
MFSDP_API mfsdp_result mfsdp_eval_forward_post(mfsdp_runtime *rt, int unit);
/* Waits until every op issued so far has completed (any point in the step). */
MFSDP_API mfsdp_result mfsdp_synchronize(mfsdp_runtime *rt);

/* ---- statistics ---- */

#define MFSDP_MAX_AXES 4
enum { MFSDP_STREAM_COMPUTE = 0, MFSDP_STREAM_INNER = 1, MFSDP_STREAM_OUTER = 2, MFSDP_NUM_STREAMS = 3 };

/* Cumulative since create; subtract two snapshots for one step. */
typedef struct mfsdp_stats {
    int64_t steps;                            /* completed step_end calls */
    int64_t ops;                              /* ops issued */
    int64_t collectives[MFSDP_MAX_AXES];      /* collectives issued per mesh axis */
    int64_t bytes[MFSDP_MAX_AXES];            /* bytes sent per rank per axis (ring model) */
    int64_t busy_ns[MFSDP_NUM_STREAMS];       /* time executing ops (not waiting on events) */
    int64_t wait_ns[MFSDP_NUM_STREAMS];       /* time blocked in event waits */
} mfsdp_stats;

MFSDP_API mfsdp_result mfsdp_get_stats(const mfsdp_runtime *rt, mfsdp_stats *out);

/* ---- helpers (runtime/engine/mf_helpers.c; docs/runtime.md, "Helpers") ----
 *
 * What every trainer would otherwise write itself. They work on host memory:
 * the local and mpi backends (a GPU backend returns MFSDP_ERR_UNSUPPORTED
 * from the ones that touch buffers or communicate). The collective ones
 * (gather, all-reduce, grad norm and clip) must be called by every rank of
 * the world, in the same order, between hooks; they use the runtime's own
 * world communicator (never the trainer's), allocate for the call, and a
 * failure (a timeout: a peer never called) is sticky like a hook's.
 */

/* fp32 <-> bf16 / fp16 with round to nearest even; NaN stays NaN (quiet),
 * overflow gives infinity. The exact conversions the runtime's casts use. */
MFSDP_API uint16_t mfsdp_f32_to_bf16(float f);
MFSDP_API float mfsdp_bf16_to_f32(uint16_t h);
MFSDP_API uint16_t mfsdp_f32_to_fp16(float f);
MFSDP_API float mfsdp_fp16_to_f32(uint16_t h);
/* dst[i] = src[i] converted from src_dtype to dst_dtype, i < n (same dtype:
 * a copy). dst and src must not overlap unless equal with equal dtypes. */
MFSDP_API mfsdp_result mfsdp_convert(void *dst, mfsdp_dtype dst_dtype, const void *src,
                                     mfsdp_dtype src_dtype, int64_t n);

/* Index of the unit with this name, or -1 (like mfsdp_tensor_find). */
MFSDP_API int mfsdp_unit_find(const mfsdp_runtime *rt, const char *name);
MFSDP_API int mfsdp_schedule_unit_find(const mfsdp_schedule *s, const char *name);

/*
 * Copies this rank's shard of tensor `tensor` out of `full` (the whole
 * tensor in host memory: numel elements of `dtype`, row-major) into its
 * main_weight, converting to main_weight_dtype. Local: no communication;
 * every rank passes the same full tensor (e.g. the same seeded init or a
 * loaded checkpoint). A rank with shard_count 0 copies nothing. Call it
 * between hooks outside a step: after mfsdp_create and before the first
 * mfsdp_step_begin (the initial weights), or after mfsdp_step_end.
 */
MFSDP_API mfsdp_result mfsdp_main_weight_scatter(mfsdp_runtime *rt, int tensor, const void *full,
                                                 mfsdp_dtype dtype);

/* A root for mfsdp_main_weight_gather: every rank receives the tensor. */
#define MFSDP_ALL_RANKS (-1)

/*
 * Gathers the whole master weight of tensor `tensor` (numel elements,
 * converted to `dtype`) into `out` on rank `root`, or on every rank with
 * MFSDP_ALL_RANKS (for logging, evaluation, export). Collective over the
 * world; `out` may be NULL on ranks that do not receive. Each element comes
 * from one rank that holds it (replicas are not compared). A tensor Distinct
 * on some axis (a different tensor per coordinate) is refused with
 * MFSDP_ERR_UNSUPPORTED on every rank, before any communication (both
 * gathers).
 */
MFSDP_API mfsdp_result mfsdp_main_weight_gather(mfsdp_runtime *rt, int tensor, void *out,
                                                mfsdp_dtype dtype, int64_t root);

/*
 * mfsdp_main_weight_gather for a caller's buffer sharded like main_weight
 * (an optimizer state such as Adam's moments): `shard` holds this rank's
 * shard_count elements of `shard_dtype` (NULL allowed where shard_count is
 * 0); the whole tensor (numel elements, converted to `dtype`) lands in `out`
 * on rank `root`, or on every rank with MFSDP_ALL_RANKS. Collective over the
 * world; each element comes from the rank whose main_weight copy
 * mfsdp_main_weight_gather takes.
 */
MFSDP_API mfsdp_result mfsdp_shard_gather(mfsdp_runtime *rt, int tensor, const void *shard,
                                          mfsdp_dtype shard_dtype, void *out, mfsdp_dtype dtype,
                                          int64_t root);

typedef enum mfsdp_reduce_op {
    MFSDP_REDUCE_SUM = 0,
    MFSDP_REDUCE_MAX = 1,
    MFSDP_REDUCE_MIN = 2,
} mfsdp_reduce_op;

/*
 * All-reduces n doubles in place over the world (a logged loss, token
 * counts, norm partials): values[i] becomes op over every rank's values[i].
 * Sums are taken in rank order in double, so every rank gets the same bits.
 * Collective over the world; n in [0, 1 << 20].
 */
MFSDP_API mfsdp_result mfsdp_allreduce(mfsdp_runtime *rt, double *values, int n, mfsdp_reduce_op op);

/*
 * The global L2 norm of the delivered gradient of every tensor: the square
 * root of the sum of squares over every rank's grad shard, where a shard
 * that several ranks hold (a replicated main_weight) counts once. Every rank
 * gets the same value. Call after mfsdp_step_end and before the next
 * mfsdp_step_begin. Collective over the world.
 */
MFSDP_API mfsdp_result mfsdp_grad_norm(mfsdp_runtime *rt, double *norm);

/*
 * Gradient clipping: computes the global norm as mfsdp_grad_norm does and,
 * when it exceeds max_norm (> 0), scales every delivered gradient shard of
 * this rank by max_norm / (norm + 1e-6) (the same factor on every rank, so
 * replicas stay equal). *norm (may be NULL) receives the norm before
 * clipping. Same calling rules as mfsdp_grad_norm.
 */
MFSDP_API mfsdp_result mfsdp_grad_clip(mfsdp_runtime *rt, double max_norm, double *norm);

#ifdef __cplusplus
}
#endif

#endif
