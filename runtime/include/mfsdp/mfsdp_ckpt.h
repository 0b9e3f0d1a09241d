/*
 * mfsdp_ckpt.h: sharded checkpoints of libmfsdp (docs/checkpoint.md).
 *
 * A checkpoint is a directory: safetensors data files, one per rank that
 * writes, and a manifest.json written last. Every rank writes only the
 * master-weight and optimizer-state elements it owns (replicas write
 * disjoint equal shares, padding is never written), so a save is plain
 * pwrite of ranges known from the schedule, in parallel, with no gathering.
 * A save is committed by renaming its temporary directory into place after
 * every file and the manifest are fsync'd: a directory named DIR is either a
 * complete checkpoint or does not exist. A load reads, on every rank, only
 * the byte ranges of the elements that rank holds, under ANY schedule with
 * the same tensors (any mesh, layout, alignment, bucketing): resuming on
 * another mesh is an ordinary load.
 *
 * Save and load are collective over the runtime's world (every rank calls
 * them with the same directory and the same state names), between steps
 * (after mfsdp_step_end and the optimizer update, before the next
 * mfsdp_step_begin). On failure every rank returns an error; the message of
 * mfsdp_last_error(rt) names the rank, the file and the reason.
 */
#ifndef MFSDP_CKPT_H
#define MFSDP_CKPT_H

#include "mfsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A named optimizer-state tensor laid out like main_weight: for every tensor
 * index k of the runtime (mfsdp_tensor_view_get), shards[k] points at
 * view.shard_count elements of `dtype` holding elements
 * [view.shard_offset, view.shard_offset + view.shard_count) of the state of
 * tensor k (NULL when shard_count is 0). Adam's exp_avg and exp_avg_sq are
 * two such states. Names: [A-Za-z0-9_.-], 1 to 64 characters, not
 * "main_weight"; at most 63 states. */
typedef struct mfsdp_ckpt_state {
    const char *name;
    mfsdp_dtype dtype;
    void **shards;
} mfsdp_ckpt_state;

typedef struct mfsdp_ckpt_save_options {
    size_t size;                   /* sizeof(mfsdp_ckpt_save_options), set by the initializers */
    uint32_t version;              /* MFSDP_ABI_VERSION, set by the initializers */
    int64_t step;                  /* recorded in the manifest (>= 0) */
    int nstates;
    const mfsdp_ckpt_state *states;
    const void *user_blob;         /* this rank's blob (data loader position, RNG), may be NULL */
    size_t user_blob_bytes;
} mfsdp_ckpt_save_options;

/* Step 0, no states, no blob. */
#define MFSDP_CKPT_SAVE_OPTIONS_INIT \
    { sizeof(mfsdp_ckpt_save_options), MFSDP_ABI_VERSION, 0, 0, NULL, NULL, 0 }
MFSDP_API void mfsdp_ckpt_save_options_init(mfsdp_ckpt_save_options *opt);

/* Load flags. */
enum {
    /* Before reading, verify every data file's CRC-32C (each rank verifies
     * an equal share of the files; the load fails if any fails). Without it,
     * every piece a rank reads whole is still CRC-checked; a resharding load
     * reads some pieces in part. */
    MFSDP_CKPT_VERIFY_FILES = 1u << 0,
};

typedef struct mfsdp_ckpt_load_options {
    size_t size;                   /* sizeof(mfsdp_ckpt_load_options), set by the initializers */
    uint32_t version;              /* MFSDP_ABI_VERSION, set by the initializers */
    uint32_t flags;                /* MFSDP_CKPT_* */
    int nstates;
    const mfsdp_ckpt_state *states; /* filled: every name must be in the checkpoint */
    int64_t user_blob_rank;        /* whose blob to read: -1 = this rank's number */
    void *user_blob;               /* receives at most user_blob_capacity bytes */
    size_t user_blob_capacity;
    size_t user_blob_bytes;        /* out: the blob's size (0: that rank saved none) */
    int64_t step;                  /* out: the saved step */
    uint64_t bytes_read;           /* out: bytes this rank read from the checkpoint's data
                                    * files (tensor data and user blob; with
                                    * MFSDP_CKPT_VERIFY_FILES also the files it verified).
                                    * Replicas of a shard share the reads on the local and
                                    * MPI backends: over the world, about the unique bytes */
} mfsdp_ckpt_load_options;

/* No flags, no states, this rank's blob (user_blob_rank -1) into no buffer. */
#define MFSDP_CKPT_LOAD_OPTIONS_INIT \
    { sizeof(mfsdp_ckpt_load_options), MFSDP_ABI_VERSION, 0u, 0, NULL, -1, NULL, 0, 0, 0, 0 }
MFSDP_API void mfsdp_ckpt_load_options_init(mfsdp_ckpt_load_options *opt);

/* Saves main_weight and the states into directory `dir` (must not exist;
 * its parent must). Writes into "DIR.tmp-ID/", then commits by rename. */
MFSDP_API mfsdp_result mfsdp_ckpt_save(mfsdp_runtime *rt, const char *dir, const mfsdp_ckpt_save_options *opt);

/* Loads main_weight and the named states from a committed checkpoint of the
 * same tensors (names, shapes, dtypes), saved under any schedule. Every
 * structural check (manifest, tensors, shapes, dtypes, coverage) passes
 * before any buffer is written; a data error found while reading (a CRC, a
 * read error) fails the load on every rank, after buffers may have been
 * partly overwritten. */
MFSDP_API mfsdp_result mfsdp_ckpt_load(mfsdp_runtime *rt, const char *dir, mfsdp_ckpt_load_options *opt);

/* Checks a checkpoint without a runtime: the manifest, every file's size,
 * header, CRC-32C and every piece's CRC-32C. MFSDP_OK, or MFSDP_ERR_LOAD with
 * mfsdp_last_error(NULL) naming the first bad file. */
MFSDP_API mfsdp_result mfsdp_ckpt_verify(const char *dir);

/* ---- Hugging Face checkpoints (docs/checkpoint.md, "Hugging Face") ---- */

/* Name rules between Hugging Face and schedule tensor names: maps are
 * "FROM=TO" prefix rewrites (Hugging Face FROM + rest <-> schedule TO +
 * rest, first match wins); ties are "NAME=SOURCE" (schedule names: NAME
 * holds SOURCE's values). NULL options: no rules. */
typedef struct mfsdp_hf_options {
    size_t size;                   /* sizeof(mfsdp_hf_options), set by the initializers */
    uint32_t version;              /* MFSDP_ABI_VERSION, set by the initializers */
    int nmaps;
    const char *const *maps;
    int nties;
    const char *const *ties;
} mfsdp_hf_options;

/* No rules. */
#define MFSDP_HF_OPTIONS_INIT { sizeof(mfsdp_hf_options), MFSDP_ABI_VERSION, 0, NULL, 0, NULL }
MFSDP_API void mfsdp_hf_options_init(mfsdp_hf_options *opt);

/* Fills main_weight from a Hugging Face checkpoint (model.safetensors, its
 * .index.json, or a directory with either; F32/BF16/F16, converted to the
 * main_weight dtype). Collective; each rank reads only the element ranges it
 * holds. Every tensor that does not map, or maps with another shape, is
 * listed in one message before any buffer is written. */
MFSDP_API mfsdp_result mfsdp_ckpt_import_hf(mfsdp_runtime *rt, const char *path, const mfsdp_hf_options *opt);

/* Writes the full main_weight tensors as a consolidated Hugging Face
 * checkpoint in directory `dir` (must not exist): model.safetensors, or
 * model-0000k-of-0000N.safetensors files of at most max_file_bytes (0: 5 GB)
 * plus model.safetensors.index.json; elements converted to `dtype`; tied
 * tensors stored once. Collective and without gathering: the layout is
 * computed from the schedule on every rank, rank 0 writes the headers, and
 * every rank pwrites the element ranges it writes in a save into the final
 * files; committed like a save (temporary directory, fsync, rename). */
MFSDP_API mfsdp_result mfsdp_ckpt_export_hf(mfsdp_runtime *rt, const char *dir, mfsdp_dtype dtype,
                                            const mfsdp_hf_options *opt, uint64_t max_file_bytes);

#ifdef __cplusplus
}
#endif

#endif
