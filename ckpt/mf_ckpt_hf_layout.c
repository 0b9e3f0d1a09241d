/*
 * mf_ckpt_hf_layout: the layout of a consolidated Hugging Face export (see
 * the header): which file holds which tensor at which byte, the headers,
 * the index, and the writer that fills the files. The runtime's export
 * (every rank writes the pieces it holds into files rank 0 created) and the
 * offline tool's (one process, tensor by tensor) both go through here, so
 * their files are the same bytes.
 */
#include "mf_ckpt_hf_layout.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mf_ckpt_io.h"
#include "mf_dtype.h"
#include "mf_free.h"

void mf_hf_layout_free(mf_hf_layout *l)
{
    for (int f = 0; l->header && f < l->nfiles; f++)
        free(l->header[f]);
    for (int k = 0; l->hf_name && k < l->ntensors; k++)
        free(l->hf_name[k]);
    MF_FREE_ALL(l->file, l->offset, l->hf_name, l->header, l->header_len, l->bytes);
    memset(l, 0, sizeof *l);
}

/* Assigns every stored tensor its file and its data-relative offset. */
static int mf_hf_layout_files(const mf_hf_shape *t, int n, const mf_hf_rules *r, uint64_t maxb, mf_hf_layout *l)
{
    char name[1024];
    uint64_t in_file = 0;
    for (int k = 0; k < n; k++) {
        uint64_t b = (uint64_t)t[k].numel * mf_dtype_size(l->dtype);
        if (mf_hf_rules_tied(r, t[k].name)) {
            l->file[k] = -1;
            continue;
        }
        if (in_file > 0 && in_file + b > maxb) {
            l->nfiles++;
            in_file = 0;
        }
        mf_ckpt_hf_to_hf(r, t[k].name, name, sizeof name);
        if (!(l->hf_name[k] = strdup(name)))
            return -1;
        l->file[k] = l->nfiles;
        l->offset[k] = in_file;
        in_file += b;
    }
    l->nfiles++;
    return 0;
}

/* File f's header (its tensors in order, {"format": "pt"}), its size. */
static int mf_hf_layout_header(const mf_hf_shape *t, int n, mf_hf_layout *l, int f, mf_st_entry *e)
{
    static const char *const keys[] = {"format"}, *const vals[] = {"pt"};
    int ne = 0;
    uint64_t data = 0;
    for (int k = 0; k < n; k++)
        if (l->file[k] == f) {
            e[ne] = (mf_st_entry){.name = l->hf_name[k], .dtype = mf_ckpt_st_dtype(l->dtype), .ndims = t[k].ndims,
                                  .begin = l->offset[k]};
            memcpy(e[ne].shape, t[k].dims, sizeof e[ne].shape);
            e[ne].end = data = e[ne].begin + (uint64_t)t[k].numel * mf_dtype_size(l->dtype);
            ne++;
        }
    if (mf_ckpt_st_build(e, ne, keys, vals, 1, &l->header[f], &l->header_len[f]) != 0)
        return -1;
    l->bytes[f] = l->header_len[f] + data;
    return 0;
}

int mf_hf_layout_build(const mf_hf_shape *t, int n, const mf_hf_rules *r, mf_dtype dt, uint64_t max_file_bytes,
                       mf_hf_layout *l)
{
    memset(l, 0, sizeof *l);
    l->ntensors = n;
    l->dtype = dt;
    l->file = calloc((size_t)n + 1, sizeof *l->file);
    l->offset = calloc((size_t)n + 1, sizeof *l->offset);
    l->hf_name = calloc((size_t)n + 1, sizeof *l->hf_name);
    mf_st_entry *e = calloc((size_t)n + 1, sizeof *e);
    int rc = -1;
    if (!l->file || !l->offset || !l->hf_name || !e || mf_hf_layout_files(t, n, r, max_file_bytes, l) != 0)
        goto done;
    l->header = calloc((size_t)l->nfiles, sizeof *l->header);
    l->header_len = calloc((size_t)l->nfiles, sizeof *l->header_len);
    l->bytes = calloc((size_t)l->nfiles, sizeof *l->bytes);
    if (!l->header || !l->header_len || !l->bytes)
        goto done;
    for (int f = 0; f < l->nfiles; f++)
        if (mf_hf_layout_header(t, n, l, f, e) != 0)
            goto done;
    for (int k = 0; k < n; k++)
        if (l->file[k] >= 0)
            l->offset[k] += l->header_len[l->file[k]];
    rc = 0;
done:
    free(e);
    if (rc != 0)
        mf_hf_layout_free(l);
    return rc;
}

void mf_hf_layout_file_name(const mf_hf_layout *l, int f, char *buf, size_t size)
{
    if (l->nfiles == 1)
        snprintf(buf, size, "model.safetensors");
    else
        snprintf(buf, size, "model-%05d-of-%05d.safetensors", f + 1, l->nfiles);
}

/* model.safetensors.index.json: the data bytes, and which file holds each
 * stored tensor. */
static int mf_hf_index_write(const mf_hf_layout *l, const char *dir, char *err, size_t errlen)
{
    uint64_t total = 0;
    char fn[64];
    for (int f = 0; f < l->nfiles; f++)
        total += l->bytes[f] - l->header_len[f];
    json_t *root = json_pack("{s{sI}s{}}", "metadata", "total_size", (json_int_t)total, "weight_map");
    json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
    for (int k = 0; wm && k < l->ntensors; k++)
        if (l->file[k] >= 0) {
            mf_hf_layout_file_name(l, l->file[k], fn, sizeof fn);
            json_object_set_new(wm, l->hf_name[k], json_string(fn));
        }
    char *text = wm ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return snprintf(err, errlen, "out of memory"), -1;
    int rc = mf_ckpt_write_small(dir, "model.safetensors.index.json", text, strlen(text), err, errlen);
    free(text);
    return rc;
}

int mf_hf_layout_create(const mf_hf_layout *l, const char *dir, char *err, size_t errlen)
{
    char path[4400], fn[64];
    for (int f = 0; f < l->nfiles; f++) {
        mf_hf_layout_file_name(l, f, fn, sizeof fn);
        snprintf(path, sizeof path, "%.4000s/%s", dir, fn);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        int ok = fd >= 0 && ftruncate(fd, (off_t)l->bytes[f]) == 0 &&
                 mf_ckpt_io_pwrite_all(fd, l->header[f], l->header_len[f], 0) == 0 && fsync(fd) == 0;
        if (fd >= 0 && close(fd) != 0)
            ok = 0;
        if (!ok)
            return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    }
    return l->nfiles == 1 ? 0 : mf_hf_index_write(l, dir, err, errlen);
}

int mf_hf_writer_open(mf_hf_writer *w, const mf_hf_layout *l, const char *dir, char *err, size_t errlen)
{
    *w = (mf_hf_writer){.l = l, .dir = dir};
    w->fd = malloc((size_t)l->nfiles * sizeof *w->fd);
    w->bounce = malloc(MF_HF_WRITE_CHUNK);
    if (!w->fd || !w->bounce) {
        free(w->fd);
        free(w->bounce);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    for (int f = 0; f < l->nfiles; f++)
        w->fd[f] = -1;
    return 0;
}

int mf_hf_writer_put(mf_hf_writer *w, int k, int64_t at, const void *src, mf_dtype sd, int64_t n, char *err,
                     size_t errlen)
{
    const mf_hf_layout *l = w->l;
    int f = l->file[k];
    size_t ds = mf_dtype_size(l->dtype), ss = mf_dtype_size(sd);
    int64_t per = (int64_t)(MF_HF_WRITE_CHUNK / (ds > ss ? ds : ss));
    if (w->fd[f] < 0) {
        char path[4400], fn[64];
        mf_hf_layout_file_name(l, f, fn, sizeof fn);
        snprintf(path, sizeof path, "%.4000s/%s", w->dir, fn);
        if ((w->fd[f] = open(path, O_WRONLY | O_CLOEXEC)) < 0)
            return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    }
    for (int64_t a = 0; a < n; a += per) {
        int64_t c = n - a < per ? n - a : per;
        mf_dtype_convert(w->bounce, l->dtype, (const char *)src + (size_t)a * ss, sd, c);
        if (mf_ckpt_io_pwrite_all(w->fd[f], w->bounce, (size_t)c * ds, l->offset[k] + (uint64_t)(at + a) * ds) != 0)
            return snprintf(err, errlen, "write error: %s", strerror(errno)), -1;
    }
    return 0;
}

int mf_hf_writer_close(mf_hf_writer *w, int sync, char *err, size_t errlen)
{
    int rc = 0;
    for (int f = 0; f < w->l->nfiles; f++)
        if (w->fd[f] >= 0) {
            if (sync && fsync(w->fd[f]) != 0 && rc == 0)
                rc = -1, snprintf(err, errlen, "fsync: %s", strerror(errno));
            close(w->fd[f]);
        }
    free(w->fd);
    free(w->bounce);
    memset(w, 0, sizeof *w);
    return rc;
}
