/*
 * mf_ckpt_hf: Hugging Face safetensors checkpoints (docs/checkpoint.md,
 * "Hugging Face"): opening one (a model.safetensors file, a
 * model.safetensors.index.json with its shards, or a directory holding
 * either), the name rules between Hugging Face and schedule tensor names,
 * matching (every mismatch in one message), ranged reads converted to the
 * destination dtype, and the layout of a consolidated export.
 *
 * Name rules: `FROM=TO` prefix rewrites, tried in order, the first whose FROM
 * prefixes the name wins (a Hugging Face name HF becomes TO + rest; on export
 * a schedule name TO + rest becomes FROM + rest); names no rule matches are
 * kept. Ties `NAME=SOURCE` (schedule names): NAME holds the same values as
 * SOURCE; import fills it from SOURCE's data, export stores it once (as
 * SOURCE).
 */
#ifndef MF_CKPT_HF_H
#define MF_CKPT_HF_H

#include <stdint.h>

#include "mf_ckpt_st.h"
#include "mf_schedule.h"

#define MF_HF_MAX_RULES 64
#define MF_HF_MAX_FILE_BYTES 5000000000ull /* 5 GB per exported file (Hugging Face's default) */

typedef struct mf_hf_rules {
    int n, ntie;
    const char *from[MF_HF_MAX_RULES], *to[MF_HF_MAX_RULES];
    const char *tie[MF_HF_MAX_RULES], *tie_src[MF_HF_MAX_RULES];
} mf_hf_rules;

typedef struct mf_hf_tensor {
    char *name;             /* Hugging Face name */
    int file;
    mf_st_dtype dtype;
    int ndims;
    int64_t dims[MF_ST_MAX_DIMS];
    int64_t numel;
    uint64_t offset;        /* absolute first byte in its file */
} mf_hf_tensor;

typedef struct mf_hf_model {
    int nfiles;
    char **paths;
    int *fds;
    int n;
    mf_hf_tensor *t;
} mf_hf_model;

/* Adds "FROM=TO" (kind 0) or a tie "NAME=SOURCE" (kind 1); the strings are
 * borrowed. -1 when malformed or too many. */
int mf_hf_rule_add(mf_hf_rules *r, int kind, const char *arg);
/* The schedule name of Hugging Face name hf, and back. */
void mf_hf_to_sched(const mf_hf_rules *r, const char *hf, char *out, size_t size);
void mf_hf_to_hf(const mf_hf_rules *r, const char *name, char *out, size_t size);

int mf_hf_open(const char *path, mf_hf_model *m, char *err, size_t errlen);
void mf_hf_close(mf_hf_model *m);
/* The runtime's dtype (mf_dtype) of a safetensors dtype, or -1 when it has none. */
int mf_hf_dtype(mf_st_dtype d);

/* Maps n schedule tensors (names, ndims, dims) to model tensors: src[k] is
 * the model tensor of schedule tensor k. Every schedule tensor without a
 * source, model tensor without a destination, shape or dtype mismatch is
 * listed in one message. 0 or -1. */
int mf_hf_match(const mf_hf_model *m, const mf_hf_rules *r, int n, const char *const *names, const int *ndims,
                const int64_t (*dims)[MF_MAX_DIMS], int *src, char *err, size_t errlen);

#endif
