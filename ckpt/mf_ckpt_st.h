/*
 * mf_ckpt_st: the safetensors file format (docs/checkpoint.md, "Data files"):
 * an 8-byte little-endian header length N, N bytes of JSON (an object: one
 * key per tensor {"dtype", "shape", "data_offsets": [begin, end]} relative to
 * the data section, plus an optional "__metadata__" object of string values),
 * then the data section. Parsing uses jansson, bounds the header at
 * MF_ST_MAX_HEADER bytes and refuses, with a message naming the file and the
 * tensor, anything the reference reader refuses: duplicate keys, unknown
 * dtypes, shapes whose size disagrees with the offsets, offsets that overlap,
 * leave a gap or run past the file.
 */
#ifndef MF_CKPT_ST_H
#define MF_CKPT_ST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mf_schedule.h"

#define MF_ST_MAX_HEADER (100u * 1000u * 1000u) /* bytes of JSON, as the reference reader */
#define MF_ST_MAX_DIMS 8

/* safetensors dtypes: X(NAME, bytes); the file names a dtype by NAME
 * (mf_st_dtype_name: "F64", "BF16", ...). */
#define MF_ST_DTYPE_LIST(X) \
    X(F64, 8)      \
    X(F32, 4)      \
    X(F16, 2)      \
    X(BF16, 2)     \
    X(I64, 8)      \
    X(I32, 4)      \
    X(I16, 2)      \
    X(I8, 1)       \
    X(U64, 8)      \
    X(U32, 4)      \
    X(U16, 2)      \
    X(U8, 1)       \
    X(BOOL, 1)     \
    X(F8_E4M3, 1)  \
    X(F8_E5M2, 1)

#define MF_ST_ENUM_ITEM(E, ...) MF_ST_##E,
typedef enum { MF_ST_DTYPE_LIST(MF_ST_ENUM_ITEM) MF_ST_DTYPE_COUNT } mf_st_dtype;
#undef MF_ST_ENUM_ITEM

const char *mf_st_dtype_name(mf_st_dtype d);
size_t mf_st_dtype_size(mf_st_dtype d);
/* -1 when unknown. */
int mf_st_dtype_from_name(const char *s);

typedef struct mf_st_entry {
    char *name;
    mf_st_dtype dtype;
    int ndims;
    int64_t shape[MF_ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;    /* bytes, relative to the data section */
} mf_st_entry;

/* A parsed header. Entries are sorted by begin. Owned by the caller:
 * release with mf_ckpt_st_free. */
typedef struct mf_st_file {
    uint64_t header_len;    /* N */
    uint64_t data_start;    /* 8 + N */
    uint64_t data_len;      /* bytes of the data section */
    int n;
    mf_st_entry *e;
    int nmeta;
    char **meta_key, **meta_val;
} mf_st_file;

/* Parses the JSON header json[0..len) of file `fname` (for messages) whose
 * data section has data_len bytes. Returns 0, or -1 with a message. */
int mf_ckpt_st_parse(const char *fname, const char *json, size_t len, uint64_t data_len, mf_st_file *out,
                     char *err, size_t errlen);
/* Reads and parses the header of the open file fd of file_size bytes. */
int mf_ckpt_st_read(int fd, const char *fname, uint64_t file_size, mf_st_file *out, char *err,
                    size_t errlen);
void mf_ckpt_st_free(mf_st_file *f);
/* The entry named `name`, or NULL (linear search). */
const mf_st_entry *mf_ckpt_st_find(const mf_st_file *f, const char *name);
/* The value of metadata key `key`, or NULL. */
const char *mf_ckpt_st_meta(const mf_st_file *f, const char *key);

/* Builds the 8-byte length and the JSON header for n entries in order (their
 * begin/end are used as given) and nmeta metadata strings. The JSON is
 * padded with spaces to a multiple of 8 bytes. *out is malloc'd
 * (8 + header bytes, in *out_len). Returns 0, or -1 when out of memory. */
int mf_ckpt_st_build(const mf_st_entry *e, int n, const char *const *meta_key,
                     const char *const *meta_val, int nmeta, uint8_t **out, size_t *out_len);

/* The safetensors dtype of a schedule dtype (F32 for one it does not
 * know); the schedule dtype (mf_dtype) of a safetensors dtype, or -1 when
 * it has none. */
mf_st_dtype mf_ckpt_st_dtype(mf_dtype d);
int mf_ckpt_st_sched_dtype(mf_st_dtype st);

#endif
