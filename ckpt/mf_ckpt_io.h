/*
 * mf_ckpt_io: the checkpoint's file I/O (docs/checkpoint.md): writing one
 * data file (safetensors, piece CRCs in its metadata, fsync'd), the commit's
 * directory operations, and reading: a reader opens a committed checkpoint
 * (its manifest), opens data files lazily, checks each file against the
 * manifest before reading from it (size, checkpoint id, every entry's name,
 * dtype, shape and offset), reads element ranges with pread and checks the
 * CRC of every piece it reads whole. Nothing here knows about runtimes.
 *
 * Defined by mf_ckpt_write.c (mf_ckpt_write_*), mf_ckpt_read.c
 * (mf_ckpt_read_*), mf_ckpt_dio.c (mf_ckpt_dio_*), mf_ckpt_parts.c
 * (mf_ckpt_parts_*) and mf_ckpt_io.c (the file-I/O helpers, mf_ckpt_io_*).
 */
#ifndef MF_CKPT_IO_H
#define MF_CKPT_IO_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "mf_ckpt_manifest.h"
#include "mf_ckpt_st.h"

#define MF_CKPT_FILE_FORMAT "mfsdp-checkpoint/1"
#define MF_CKPT_IO_CHUNK ((size_t)16 << 20) /* bounce buffer and largest single I/O */
#define MF_CKPT_READ_CHUNK ((size_t)2 << 20) /* a load's pread, CRC'd while in cache */

/* One entry of a data file to write: its bytes come from `data` when
 * non-NULL, else from the fill callback. */
typedef struct mf_ckpt_wentry {
    char *name;
    mf_st_dtype dtype;
    int ndims;
    int64_t shape[MF_ST_MAX_DIMS];
    const void *data;
    uint64_t bytes;
} mf_ckpt_wentry;

/* Writes bytes [off, off + n) of entry `entry` into buf. 0, or -1 with err. */
typedef int (*mf_ckpt_fill_fn)(void *ctx, int entry, uint64_t off, void *buf, size_t n, char *err,
                               size_t errlen);

typedef struct mf_ckpt_written {
    uint64_t bytes;         /* file size */
    uint64_t header_bytes;  /* 8 + JSON header: the data section's first byte */
    uint32_t crc32c;        /* of the whole file */
} mf_ckpt_written;

/* Creates `path` (must not exist) holding the entries in order, with
 * metadata format, checkpoint id `id`, `rank` and the entries' CRCs; fsyncs
 * and closes it (Hugging Face files: mf_ckpt_hf_layout.h). On failure the
 * file is removed. Returns 0 or -1 with a message. */
int mf_ckpt_write_file(const char *path, const mf_ckpt_wentry *e, int n, const char *id, int64_t rank,
                       mf_ckpt_fill_fn fill, void *ctx, mf_ckpt_written *out, char *err, size_t errlen);
/* pwrite/pread of all n bytes (loops over short transfers). 0 or -1 (errno). */
int mf_ckpt_io_pwrite_all(int fd, const void *buf, size_t n, uint64_t off);
int mf_ckpt_io_pread_all(int fd, void *buf, size_t n, uint64_t off);
/* Opens `path` for reading (O_RDONLY | O_CLOEXEC | flags) only when it is
 * a regular file: the open is O_NONBLOCK, so that a FIFO or a device in
 * its place cannot block it, then fstat (into *st when non-NULL) refuses
 * anything else; the descriptor is returned blocking. -1 with errno kept
 * from the failing call and a message naming the path ("cannot open: ...",
 * "a FIFO, not a regular file: refused"). */
int mf_ckpt_io_open_regular(const char *path, int flags, struct stat *st, char *err, size_t errlen);
/* The length of directory name `dir` without its trailing slashes
 * ("ckpt/" and "ckpt//" name "ckpt"; "/" stays "/"): outputs are created
 * as DIR.tmp-ID next to DIR, so the slash must go. */
size_t mf_ckpt_io_dir_len(const char *dir);
/* fsync of a directory. 0 or -1 (errno). */
int mf_ckpt_io_fsync_dir(const char *path);
/* Removes the regular files in `dir` and `dir` itself (best effort). */
void mf_ckpt_io_remove_dir(const char *dir);
/* Writes text to DIR/name (new file), fsyncs it. 0 or -1 with a message. */
int mf_ckpt_write_small(const char *dir, const char *name, const char *text, size_t len, char *err,
                        size_t errlen);
/* Commits: fsync tmp, rename tmp -> dir, fsync the parent of dir. */
int mf_ckpt_write_commit_dir(const char *tmp, const char *dir, char *err, size_t errlen);

/* ---- reading ---- */

typedef struct mf_ckpt_rfile {
    int fd;                 /* -1 until opened */
    int checked;            /* 1 ok, -1 refused (msg kept in reader) */
    uint32_t *crc;          /* per manifest piece of the file, file order */
    /* Direct reads (mf_ckpt_dio.c): dfd the O_DIRECT descriptor (-1:
     * plain reads only), align its alignment, map a read-only mapping of
     * the file (to ask which pages are cached), size its bytes. */
    int dfd;
    uint32_t align;
    void *map;
    uint64_t size;
} mf_ckpt_rfile;

/* Bytes [off, off + len) of manifest piece `piece` (off from the piece's
 * first byte), read by mf_ckpt_read without the rest of the piece: their
 * CRC-32C, the piece's own from its file's header (want), and the rank
 * that read them (0 unless a load sets it). A piece's CRC can be checked
 * once its parts, however many readers took them, cover it
 * (mf_ckpt_parts_check). */
typedef struct mf_ckpt_part {
    int64_t piece;
    uint64_t off, len;      /* bytes */
    uint32_t crc, want;
    int64_t rank;
} mf_ckpt_part;

typedef struct mf_ckpt_reader {
    char *dir;
    mf_ckpt_manifest m;
    mf_ckpt_rfile *f;
    uint64_t bytes_read;    /* data bytes read by mf_ckpt_read/blob */
    mf_ckpt_part *parts;    /* the pieces read in part so far, in read order */
    int64_t nparts, partcap;
    /* Optional (NULL: none): called by mf_ckpt_read after each chunk it
     * read and added to the piece's CRC, while the chunk is in the CPU's
     * cache: data = dst + off of that call, n bytes. */
    void (*chunk)(void *ctx, size_t off, const void *data, size_t n);
    void *chunk_ctx;
    /* 1: mf_ckpt_read's dst is not host memory (device buffers): the bytes
     * go only to the chunk callback, from the bounce buffer or a 2 MiB
     * scratch buffer (allocated on first use), and dst is never touched. */
    int nodst;
    char *scratch;
    /* Direct reads' bounce buffer (NULL until the first) and the window it
     * holds: file bfile's bytes [bat, bat + blen) (bfile -1: none). */
    char *bounce;
    uint64_t direct_bytes;  /* bytes read from the disk by direct reads */
    int bfile;
    uint64_t bat;
    size_t blen;
} mf_ckpt_reader;

/* Reads DIR/manifest.json (bounded, opened as mf_ckpt_io_open_regular does)
 * and parses it; a missing manifest is reported as an uncommitted
 * checkpoint. */
int mf_ckpt_read_manifest(const char *dir, mf_ckpt_manifest *out, char *err, size_t errlen);
int mf_ckpt_read_open(const char *dir, mf_ckpt_reader *r, char *err, size_t errlen);
void mf_ckpt_read_close(mf_ckpt_reader *r);
/* Opens and checks data file f against the manifest (once). */
int mf_ckpt_read_open_file(mf_ckpt_reader *r, int f, char *err, size_t errlen);
/* Reads elements [start, end) of (state, tensor) into dst (the state's
 * dtype). Pieces read whole are CRC-checked; a piece read in part is
 * recorded in r->parts (adjacent parts of one piece merged), whose CRCs
 * mf_ckpt_parts_check checks: a caller that reads in part must call it
 * before it trusts the data. */
int mf_ckpt_read(mf_ckpt_reader *r, int state, int tensor, int64_t start, int64_t end, void *dst, char *err,
                 size_t errlen);
/* The user blob saved by `rank`: *len its size (0: none); copies at most
 * cap bytes into buf (buf may be NULL with cap 0 to ask the size). */
int mf_ckpt_read_blob(mf_ckpt_reader *r, int64_t rank, void *buf, size_t cap, size_t *len, char *err,
                      size_t errlen);
/* Direct reads (mf_ckpt_dio.c): after file f was checked (rf->fd open,
 * size bytes), sets up its O_DIRECT descriptor where the file system does
 * direct I/O (else leaves plain reads); mf_ckpt_dio_close undoes it. */
void mf_ckpt_dio_open(mf_ckpt_rfile *rf, const char *path, uint64_t size);
void mf_ckpt_dio_close(mf_ckpt_rfile *rf);
/* Bytes [off, off + n) of file f into dst, direct from the disk when they
 * are not in the page cache, else by pread; adds them to *crc and passes
 * each chunk to r->chunk (offset base + its position in dst). 0, or -1
 * (errno) on a read error. */
int mf_ckpt_dio_fetch(mf_ckpt_reader *r, int f, uint64_t off, size_t n, char *dst, size_t base, uint32_t *crc);
/* Checks the CRC of every piece that parts[0..n) (from any ranks) read in
 * part and whose first part, sorted by piece, offset, length and rank, was
 * read by rank `me`: the parts' CRCs combined in order, bytes that no part
 * covers read here (pread, counted in bytes_read). Sorts parts in place.
 * 0, or -1 with a message naming the file and the entry. */
int mf_ckpt_parts_check(mf_ckpt_reader *r, mf_ckpt_part *parts, int64_t n, int64_t me, char *err, size_t errlen);
/* Reads file f whole: the file CRC and every piece's CRC. */
int mf_ckpt_read_verify_file(mf_ckpt_reader *r, int f, char *err, size_t errlen);

#endif
