/*
 * mf_ckpt_write: one data file of a checkpoint, and the commit's directory
 * operations (docs/checkpoint.md, "Commit protocol").
 *
 * A data file is written in one pass: the header is laid out with
 * placeholder CRCs (fixed width, so the layout does not depend on them), the
 * data section is written while every piece's CRC-32C is computed, then the
 * final header is written at offset 0 and the file is fsync'd. The file's
 * CRC is combined from the header's and the pieces' CRCs without a re-read.
 */
#include "mf_ckpt_io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mf_ckpt_crc.h"

/* Builds the header of the entries with these CRCs (NULL: placeholders). */
static int mf_ckpt_header(const mf_ckpt_wentry *e, int n, const char *id, int64_t rank, const uint32_t *crc,
                          uint8_t **out, size_t *out_len)
{
    mf_st_entry *se = calloc((size_t)(n ? n : 1), sizeof *se);
    char *crcs = malloc((size_t)n * 9 + 1), rk[24];
    int rc = -1;
    if (!se || !crcs)
        goto done;
    uint64_t at = 0;
    crcs[0] = '\0';
    for (int i = 0; i < n; i++) {
        se[i].name = e[i].name;
        se[i].dtype = e[i].dtype;
        se[i].ndims = e[i].ndims;
        memcpy(se[i].shape, e[i].shape, sizeof se[i].shape);
        se[i].begin = at;
        se[i].end = at += e[i].bytes;
        snprintf(crcs + (i ? 9 * i - 1 : 0), 10, "%s%08" PRIx32, i ? "," : "", crc ? crc[i] : 0u);
    }
    snprintf(rk, sizeof rk, "%" PRId64, rank);
    const char *keys[] = {"mfsdp.format", "mfsdp.checkpoint_id", "mfsdp.rank", "mfsdp.crc32c"};
    const char *vals[] = {MF_CKPT_FILE_FORMAT, id, rk, crcs};
    rc = mf_ckpt_st_build(se, n, keys, vals, 4, out, out_len);
done:
    free(se);
    free(crcs);
    return rc;
}

/* Writes entry i's bytes at `off`, CRC into *crc. */
static int mf_ckpt_write_entry(int fd, const mf_ckpt_wentry *e, int i, uint64_t off, mf_ckpt_fill_fn fill,
                               void *ctx, uint8_t **bounce, uint32_t *crc, char *err, size_t errlen)
{
    *crc = 0;
    if (e->data) {
        *crc = mf_ckpt_crc_update(0, e->data, e->bytes);
        if (mf_ckpt_io_pwrite_all(fd, e->data, e->bytes, off) != 0)
            return snprintf(err, errlen, "write error: %s", strerror(errno)), -1;
        return 0;
    }
    if (!*bounce && !(*bounce = malloc(MF_CKPT_IO_CHUNK)))
        return snprintf(err, errlen, "out of memory"), -1;
    for (uint64_t at = 0; at < e->bytes;) {
        size_t k = e->bytes - at > MF_CKPT_IO_CHUNK ? MF_CKPT_IO_CHUNK : (size_t)(e->bytes - at);
        if (fill(ctx, i, at, *bounce, k, err, errlen) != 0)
            return -1;
        *crc = mf_ckpt_crc_update(*crc, *bounce, k);
        if (mf_ckpt_io_pwrite_all(fd, *bounce, k, off + at) != 0)
            return snprintf(err, errlen, "write error: %s", strerror(errno)), -1;
        at += k;
    }
    return 0;
}

int mf_ckpt_write_file(const char *path, const mf_ckpt_wentry *e, int n, const char *id, int64_t rank,
                       mf_ckpt_fill_fn fill, void *ctx, mf_ckpt_written *out, char *err, size_t errlen)
{
    char msg[1024] = "";
    uint8_t *hdr = NULL, *bounce = NULL;
    size_t hlen = 0, hlen2 = 0;
    uint32_t *crc = calloc((size_t)(n ? n : 1), sizeof *crc);
    int rc = -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        free(crc);
        return -1;
    }
    if (!crc || mf_ckpt_header(e, n, id, rank, NULL, &hdr, &hlen) != 0) {
        snprintf(msg, sizeof msg, "out of memory");
        goto done;
    }
    uint64_t at = hlen, data_crc = 0;
    for (int i = 0; i < n; i++) {
        if (mf_ckpt_write_entry(fd, &e[i], i, at, fill, ctx, &bounce, &crc[i], msg, sizeof msg) != 0)
            goto done;
        data_crc = mf_ckpt_crc_combine((uint32_t)data_crc, crc[i], e[i].bytes);
        at += e[i].bytes;
    }
    free(hdr);
    hdr = NULL;
    if (mf_ckpt_header(e, n, id, rank, crc, &hdr, &hlen2) != 0 || hlen2 != hlen) {
        snprintf(msg, sizeof msg, "out of memory (header)");
        goto done;
    }
    if (mf_ckpt_io_pwrite_all(fd, hdr, hlen, 0) != 0 || fsync(fd) != 0) {
        snprintf(msg, sizeof msg, "write error: %s", strerror(errno));
        goto done;
    }
    out->bytes = at;
    out->header_bytes = hlen;
    out->crc32c = mf_ckpt_crc_combine(mf_ckpt_crc_update(0, hdr, hlen), (uint32_t)data_crc, at - hlen);
    rc = 0;
done:
    if (close(fd) != 0 && rc == 0) {
        snprintf(msg, sizeof msg, "close: %s", strerror(errno));
        rc = -1;
    }
    if (rc != 0) {
        unlink(path);
        snprintf(err, errlen, "%s: %s", path, msg);
    }
    free(hdr);
    free(bounce);
    free(crc);
    return rc;
}

int mf_ckpt_write_small(const char *dir, const char *name, const char *text, size_t len, char *err,
                        size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno)), -1;
    int rc = mf_ckpt_io_pwrite_all(fd, text, len, 0) == 0 && fsync(fd) == 0 ? 0 : -1;
    int e = errno;
    if (close(fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        unlink(path);
        snprintf(err, errlen, "%s: write error: %s", path, strerror(e));
    }
    return rc;
}

int mf_ckpt_write_commit_dir(const char *tmp, const char *dir, char *err, size_t errlen)
{
    if (mf_ckpt_io_fsync_dir(tmp) != 0)
        return snprintf(err, errlen, "%s: fsync: %s", tmp, strerror(errno)), -1;
    /* Never over an existing checkpoint (rename(2) would replace an empty
     * directory). */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_NOREPLACE) != 0)
        return snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, dir, strerror(errno)), -1;
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        parent[1] = '\0';
    else
        *slash = '\0';
    if (mf_ckpt_io_fsync_dir(parent) != 0)
        return snprintf(err, errlen, "%s: fsync of the parent directory: %s", parent, strerror(errno)), -1;
    return 0;
}
