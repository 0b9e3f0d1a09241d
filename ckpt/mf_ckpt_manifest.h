/*
 * mf_ckpt_manifest: the checkpoint's manifest.json (docs/checkpoint.md,
 * "The manifest"): format and version, checkpoint id, step, the saving
 * schedule's mesh and hash, the states (main_weight first) and tensors, and
 * per data file its size, CRC-32C, the pieces it holds and the user blob.
 * Written with jansson; parsed with jansson and checked completely: every
 * reference in range, file names plain, the pieces of every (state, tensor)
 * tiling the tensor exactly, every piece inside its file. Messages name the
 * manifest and the offending item ("manifest.json: files[2].pieces[7]: ...").
 */
#ifndef MF_CKPT_MANIFEST_H
#define MF_CKPT_MANIFEST_H

#include <stdint.h>

#include "mf_schedule.h"

#define MF_CKPT_FORMAT "mfsdp-checkpoint"
#define MF_CKPT_VERSION 1
#define MF_CKPT_MANIFEST "manifest.json"
#define MF_CKPT_MAX_MANIFEST (1024u * 1024u * 1024u) /* bytes */

typedef struct mf_ckpt_mstate {
    char *name;
    mf_dtype dtype;
} mf_ckpt_mstate;

typedef struct mf_ckpt_mtensor {
    char *name;
    int ndims;
    int64_t dims[MF_MAX_DIMS];
    int64_t numel;
} mf_ckpt_mtensor;

typedef struct mf_ckpt_mpiece {
    int state, tensor, file;
    int64_t start, end;     /* tensor-local elements */
    uint64_t offset;        /* first byte in the file */
} mf_ckpt_mpiece;

typedef struct mf_ckpt_mfile {
    char *name;             /* plain file name inside the checkpoint directory */
    int64_t rank;           /* the rank that wrote it */
    uint64_t bytes;
    uint32_t crc32c;
    int first, npieces;     /* manifest pieces [first, first + npieces), file order */
    uint64_t blob_offset, blob_bytes; /* the rank's user blob (bytes 0: none) */
} mf_ckpt_mfile;

typedef struct mf_ckpt_manifest {
    int version;
    char id[33];            /* 32 lowercase hex digits */
    int64_t step;
    char schedule_sha256[65];
    int naxes;
    char *axis_name[MF_MAX_AXES];
    int64_t axis_size[MF_MAX_AXES];
    int64_t world;
    int nstates;
    mf_ckpt_mstate *states; /* states[0] is main_weight */
    int ntensors;
    mf_ckpt_mtensor *tensors;
    int nfiles;
    mf_ckpt_mfile *files;
    int64_t npieces;
    mf_ckpt_mpiece *pieces; /* grouped by file */
    int64_t *by_tensor;     /* npieces indices sorted by (state, tensor, start) (parse only) */
} mf_ckpt_manifest;

/* The manifest as JSON (malloc'd, NUL-terminated), or NULL (out of memory). */
char *mf_ckpt_manifest_dump(const mf_ckpt_manifest *m);
/* Parses and checks text[0..len) of file `fname`. Returns 0, or -1 with a
 * message. */
int mf_ckpt_manifest_parse(const char *fname, const char *text, size_t len, mf_ckpt_manifest *out,
                           char *err, size_t errlen);
void mf_ckpt_manifest_free(mf_ckpt_manifest *m);
/* Index of the tensor / state named `name`, or -1. */
int mf_ckpt_manifest_tensor(const mf_ckpt_manifest *m, const char *name);
int mf_ckpt_manifest_state(const mf_ckpt_manifest *m, const char *name);
/* The safetensors entry name of piece p: "STATE:TENSOR[START:END]". */
int mf_ckpt_manifest_piece_name(const mf_ckpt_manifest *m, const mf_ckpt_mpiece *p, char *buf, size_t size);
/* 1 when a state name is acceptable: [A-Za-z0-9_.-]{1,64}. */
int mf_ckpt_manifest_state_name_ok(const char *s);

#endif
