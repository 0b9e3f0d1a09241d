/*
 * mf_ckpt_hf_layout: the layout of a consolidated Hugging Face export
 * (docs/checkpoint.md, "Hugging Face") and the writer of its files, for the
 * runtime's export and the offline tool's alike. The layout is a function
 * of the tensors, the rules, the dtype and the file limit alone, so every
 * rank of a runtime and the offline tool compute the same one, and write the
 * same bytes: the tensors in order, tied ones
 * (NAME of a tie) not stored, the others in files of consecutive tensors up
 * to max_file_bytes of data each (a larger tensor alone), named
 * model.safetensors when there is one, else model-0000k-of-0000N.safetensors
 * with model.safetensors.index.json ({"metadata": {"total_size"},
 * "weight_map"}); every header has the metadata {"format": "pt"}.
 */
#ifndef MF_CKPT_HF_LAYOUT_H
#define MF_CKPT_HF_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "mf_ckpt_hf.h"

typedef struct mf_hf_layout {
    int ntensors, nfiles;
    mf_dtype dtype;         /* of every stored tensor */
    int *file;              /* per tensor: its file; -1 when tied (stored as its source) */
    uint64_t *offset;       /* per tensor: its first byte in its file */
    char **hf_name;         /* per tensor: its Hugging Face name; NULL when tied */
    uint8_t **header;       /* per file: the 8-byte length and the JSON header */
    size_t *header_len;     /* per file: bytes of header */
    uint64_t *bytes;        /* per file: its size (header and data) */
} mf_hf_layout;

/* 0, or -1 when out of memory (*l then empty). Release with mf_hf_layout_free. */
int mf_hf_layout_build(const mf_hf_shape *t, int n, const mf_hf_rules *r, mf_dtype dt, uint64_t max_file_bytes,
                       mf_hf_layout *l);
void mf_hf_layout_free(mf_hf_layout *l);
/* The name of file f of the layout. */
void mf_hf_layout_file_name(const mf_hf_layout *l, int f, char *buf, size_t size);
/* Creates the layout's files in directory dir (they must not exist) at
 * their full size with their headers, fsync'd, and the index when there are
 * several files. 0, or -1 with a message naming the file. */
int mf_hf_layout_create(const mf_hf_layout *l, const char *dir, char *err, size_t errlen);

/* Writes ranges of tensors into the files mf_hf_layout_create made,
 * converted to the layout's dtype through a bounce buffer of its own;
 * opens each file on first use. */
typedef struct mf_hf_writer {
    const mf_hf_layout *l;  /* borrowed */
    const char *dir;        /* borrowed */
    int *fd;                /* per file: -1 until opened */
    uint8_t *bounce;        /* MF_HF_WRITE_CHUNK bytes */
} mf_hf_writer;

#define MF_HF_WRITE_CHUNK ((size_t)1 << 20) /* bytes converted and written at once */

int mf_hf_writer_open(mf_hf_writer *w, const mf_hf_layout *l, const char *dir, char *err, size_t errlen);
/* Elements [at, at + n) of stored tensor k, from src (n elements of dtype
 * sd). 0, or -1 with a message. */
int mf_hf_writer_put(mf_hf_writer *w, int k, int64_t at, const void *src, mf_dtype sd, int64_t n, char *err,
                     size_t errlen);
/* Closes every file, fsync'd first when sync (a failed fsync: -1 with a
 * message); releases the writer. */
int mf_hf_writer_close(mf_hf_writer *w, int sync, char *err, size_t errlen);

#endif
