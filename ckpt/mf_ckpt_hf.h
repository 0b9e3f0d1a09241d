/*
 * mf_ckpt_hf: Hugging Face safetensors checkpoints (docs/checkpoint.md,
 * "Hugging Face"), the one engine of the runtime's import and export and of
 * the offline tool's: opening one (a model.safetensors file, a
 * model.safetensors.index.json with its shards, or a directory holding
 * either), the name rules between Hugging Face and schedule tensor names,
 * matching (every mismatch in one message), ranged reads converted to the
 * destination dtype; the layout of a consolidated export and the writer of
 * its files are mf_ckpt_hf_layout.h.
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

#include "mf_ckpt_manifest.h"
#include "mf_ckpt_plan.h"
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

/* One schedule tensor as matching and an export see it. */
typedef struct mf_hf_shape {
    const char *name;       /* schedule name (borrowed) */
    int ndims;
    int64_t dims[MF_MAX_DIMS];
    int64_t numel;
} mf_hf_shape;

/* Adds "FROM=TO" (kind 0) or a tie "NAME=SOURCE" (kind 1): FROM and NAME
 * are copied, TO and SOURCE borrowed from arg. -1 when malformed or too
 * many. */
int mf_ckpt_hf_rule_add(mf_hf_rules *r, int kind, const char *arg);
/* Adds nmaps rules maps[i] and nties ties ties[i] (none when n <= 0); -1
 * when an array or a string is NULL or a rule is malformed. */
int mf_hf_rules_add(mf_hf_rules *r, int nmaps, const char *const *maps, int nties, const char *const *ties);
/* Releases what mf_ckpt_hf_rule_add copied; *r is empty again. */
void mf_hf_rules_free(mf_hf_rules *r);
/* 1 when schedule tensor `name` is the NAME of a tie. */
int mf_hf_rules_tied(const mf_hf_rules *r, const char *name);
/* The schedule name of Hugging Face name hf, and back. */
void mf_ckpt_hf_to_sched(const mf_hf_rules *r, const char *hf, char *out, size_t size);
void mf_ckpt_hf_to_hf(const mf_hf_rules *r, const char *name, char *out, size_t size);

int mf_ckpt_hf_open(const char *path, mf_hf_model *m, char *err, size_t errlen);
void mf_ckpt_hf_close(mf_hf_model *m);

/* *t = name (borrowed), ndims <= MF_MAX_DIMS sizes dims[], numel. */
void mf_hf_shape_init(mf_hf_shape *t, const char *name, int ndims, const int64_t *dims, int64_t numel);
/* The tensors of a checkpoint plan, or of a manifest, in their order
 * (names borrowed): malloc'd, n + 1 entries; NULL when out of memory. A
 * plan's split global tensor (mf_ckpt_plan.h) is listed once per
 * coordinate, each time with the global tensor's dims (gdims). */
mf_hf_shape *mf_ckpt_hf_shapes_of_plan(const mf_ckpt_plan *p);
mf_hf_shape *mf_ckpt_hf_shapes_of_manifest(const mf_ckpt_manifest *m);

/* Maps n schedule tensors t[] to model tensors: src[k] is the model tensor
 * of schedule tensor k. Every schedule tensor without a source, model tensor
 * without a destination, shape or dtype mismatch is listed in one message.
 * 0 or -1. */
int mf_ckpt_hf_match(const mf_hf_model *m, const mf_hf_rules *r, const mf_hf_shape *t, int n, int *src, char *err,
                     size_t errlen);
/* Elements [start, end) of model tensor t, converted to dst_dtype, into dst
 * (core/mf_dtype.h). 0, or -1 with a message naming the file. */
int mf_hf_model_read(const mf_hf_model *m, int t, int64_t start, int64_t end, void *dst, mf_dtype dst_dtype,
                     char *err, size_t errlen);

#endif
