/*
 * mf_ckpt_read: reading a committed checkpoint (see mf_ckpt_io.h). Every
 * data file is checked against the manifest before the first byte of data is
 * read from it; messages name the file.
 */
#include "mf_ckpt_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mf_ckpt_crc.h"
#include "mf_diag.h"
#include "mf_free.h"

int mf_ckpt_read_manifest(const char *dir, mf_ckpt_manifest *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, MF_CKPT_MANIFEST);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return mf_diag_errf(err, errlen, "%s: no such checkpoint directory", dir), -1;
    /* DIR.tmp-ID: a save that never reached its rename (the commit point). */
    size_t n = mf_ckpt_io_dir_len(dir);
    if (n >= 37 && memcmp(dir + n - 37, ".tmp-", 5) == 0 && strspn(dir + n - 32, "0123456789abcdef") >= 32)
        return mf_diag_errf(err, errlen, "%.*s: the temporary directory of a save that did not commit: not a "
                            "committed checkpoint", (int)n, dir), -1;
    int fd = mf_ckpt_io_open_regular(path, 0, &st, err, errlen);
    if (fd < 0 && errno == ENOENT)
        return mf_diag_errf(err, errlen, "%s: manifest.json is missing: not a committed checkpoint (no manifest: the "
                            "save did not complete)", dir), -1;
    if (fd < 0)
        return -1;
    int rc = -1;
    char *text = NULL;
    if ((uint64_t)st.st_size > MF_CKPT_MAX_MANIFEST) {
        mf_diag_errf(err, errlen, "%s: not a regular file of at most %u bytes", path, MF_CKPT_MAX_MANIFEST);
        goto done;
    }
    text = malloc((size_t)st.st_size + 1);
    if (!text) {
        mf_diag_errf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    if (mf_ckpt_io_pread_all(fd, text, (size_t)st.st_size, 0) != 0) {
        mf_diag_errf(err, errlen, "%s: read error: %s", path, errno == ENODATA ? "unexpected end" : strerror(errno));
        goto done;
    }
    rc = mf_ckpt_manifest_parse(path, text, (size_t)st.st_size, out, err, errlen);
done:
    free(text);
    close(fd);
    return rc;
}

int mf_ckpt_read_open(const char *dir, mf_ckpt_reader *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (mf_ckpt_read_manifest(dir, &r->m, err, errlen) != 0)
        return -1;
    r->dir = strdup(dir);
    r->f = calloc((size_t)r->m.nfiles + 1, sizeof *r->f);
    if (!r->dir || !r->f) {
        mf_ckpt_read_close(r);
        return snprintf(err, errlen, "%s: out of memory", dir), -1;
    }
    for (int f = 0; f < r->m.nfiles; f++)
        r->f[f].fd = r->f[f].dfd = -1;
    r->bfile = -1;
    return 0;
}

void mf_ckpt_read_close(mf_ckpt_reader *r)
{
    for (int f = 0; r->f && f < r->m.nfiles; f++) {
        mf_ckpt_dio_close(&r->f[f]);
        if (r->f[f].fd >= 0)
            close(r->f[f].fd);
        free(r->f[f].crc);
    }
    MF_FREE_ALL(r->f, r->parts, r->bounce, r->scratch, r->dir);
    mf_ckpt_manifest_free(&r->m);
    memset(r, 0, sizeof *r);
}

/* Parses the metadata's CRC list into crc[n]. */
static int mf_ckpt_parse_crcs(const char *s, uint32_t *crc, int n)
{
    for (int i = 0; i < n; i++) {
        char *end;
        if (!s || strspn(s, "0123456789abcdef") != 8)
            return -1;
        crc[i] = (uint32_t)strtoul(s, &end, 16);
        if (end != s + 8 || (*end != (i + 1 < n ? ',' : '\0')))
            return -1;
        s = end + (i + 1 < n);
    }
    return n == 0 && s && *s ? -1 : 0;
}

/* Compares the parsed header with the manifest's view of file f. */
static int mf_ckpt_check_header(mf_ckpt_reader *r, int f, const mf_st_file *h, const char *path, char *err,
                                size_t errlen)
{
    const mf_ckpt_manifest *m = &r->m;
    const mf_ckpt_mfile *mf = &m->files[f];
    const char *id = mf_ckpt_st_meta(h, "mfsdp.checkpoint_id"), *fmt = mf_ckpt_st_meta(h, "mfsdp.format");
    if (!fmt || strcmp(fmt, MF_CKPT_FILE_FORMAT) != 0)
        return snprintf(err, errlen, "%s: not a data file of an %s checkpoint", path, MF_CKPT_FILE_FORMAT), -1;
    if (!id || strcmp(id, m->id) != 0)
        return snprintf(err, errlen, "%s: belongs to checkpoint %s, not to this one (%s): a file from another "
                        "checkpoint", path, id ? id : "(none)", m->id), -1;
    int want = mf->npieces + (mf->blob_bytes ? 1 : 0);
    if (h->n != want)
        return snprintf(err, errlen, "%s: holds %d entries, the manifest says %d", path, h->n, want), -1;
    char name[1200];
    for (int i = 0; i < mf->npieces; i++) {
        const mf_ckpt_mpiece *p = &m->pieces[mf->first + i];
        const mf_st_entry *e = &h->e[i];
        mf_ckpt_manifest_piece_name(m, p, name, sizeof name);
        uint64_t bytes = (uint64_t)(p->end - p->start) * mf_dtype_size(m->states[p->state].dtype);
        if (strcmp(e->name, name) != 0 || e->dtype != mf_ckpt_st_dtype(m->states[p->state].dtype) ||
            e->begin + h->data_start != p->offset || e->end - e->begin != bytes)
            return snprintf(err, errlen, "%s: entry %d is '%s' (%s, bytes [%llu, %llu)); the manifest says '%s' "
                            "(%s, bytes [%llu, %llu))", path, i, e->name, mf_st_dtype_name(e->dtype),
                            (unsigned long long)(e->begin + h->data_start),
                            (unsigned long long)(e->end + h->data_start), name,
                            mf_dtype_name(m->states[p->state].dtype), (unsigned long long)p->offset,
                            (unsigned long long)(p->offset + bytes)), -1;
    }
    if (mf->blob_bytes) {
        const mf_st_entry *e = &h->e[h->n - 1];
        if (strcmp(e->name, "user_blob") != 0 || e->begin + h->data_start != mf->blob_offset ||
            e->end - e->begin != mf->blob_bytes)
            return snprintf(err, errlen, "%s: the user blob is not where the manifest says", path), -1;
    }
    r->f[f].crc = calloc((size_t)want + 1, sizeof *r->f[f].crc);
    if (!r->f[f].crc)
        return snprintf(err, errlen, "%s: out of memory", path), -1;
    if (mf_ckpt_parse_crcs(mf_ckpt_st_meta(h, "mfsdp.crc32c"), r->f[f].crc, want) != 0)
        return snprintf(err, errlen, "%s: metadata mfsdp.crc32c is not %d CRCs", path, want), -1;
    return 0;
}

int mf_ckpt_read_open_file(mf_ckpt_reader *r, int f, char *err, size_t errlen)
{
    mf_ckpt_rfile *rf = &r->f[f];
    const mf_ckpt_mfile *mf = &r->m.files[f];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", r->dir, mf->name);
    if (rf->checked > 0)
        return 0;
    if (rf->checked < 0)
        return snprintf(err, errlen, "%s: refused before", path), -1;
    rf->checked = -1;
    struct stat st;
    if ((rf->fd = mf_ckpt_io_open_regular(path, 0, &st, err, errlen)) < 0)
        return -1;
    (void)posix_fadvise(rf->fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* a hint: larger readahead */
    if ((uint64_t)st.st_size != mf->bytes)
        return snprintf(err, errlen, "%s: %llu bytes, the manifest says %llu (truncated or replaced)", path,
                        (unsigned long long)st.st_size, (unsigned long long)mf->bytes), -1;
    mf_st_file h;
    if (mf_ckpt_st_read(rf->fd, path, mf->bytes, &h, err, errlen) != 0)
        return -1;
    int rc = mf_ckpt_check_header(r, f, &h, path, err, errlen);
    mf_ckpt_st_free(&h);
    if (rc == 0) {
        rf->checked = 1;
        mf_ckpt_dio_open(rf, path, mf->bytes);
    }
    return rc;
}

/* First index into by_tensor of (state, tensor) pieces, and their count. */
static int64_t mf_ckpt_pieces_of(const mf_ckpt_manifest *m, int state, int tensor, int64_t *count)
{
    int64_t lo = 0, hi = m->npieces;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const mf_ckpt_mpiece *p = &m->pieces[m->by_tensor[mid]];
        if (p->state < state || (p->state == state && p->tensor < tensor))
            lo = mid + 1;
        else
            hi = mid;
    }
    int64_t e = lo;
    while (e < m->npieces && m->pieces[m->by_tensor[e]].state == state &&
           m->pieces[m->by_tensor[e]].tensor == tensor)
        e++;
    *count = e - lo;
    return lo;
}

/* Records bytes [off, off + len) of piece pi as read in part, merged with
 * the previous part when it ends where this one starts. */
static int mf_ckpt_note_part(mf_ckpt_reader *r, int64_t pi, uint64_t off, uint64_t len, uint32_t crc,
                             uint32_t want)
{
    mf_ckpt_part *last = r->nparts ? &r->parts[r->nparts - 1] : NULL;
    if (last && last->piece == pi && last->off + last->len == off) {
        last->crc = mf_ckpt_crc_combine(last->crc, crc, len);
        last->len += len;
        return 0;
    }
    if (r->nparts == r->partcap) {
        int64_t cap = r->partcap ? 2 * r->partcap : 64;
        mf_ckpt_part *p = realloc(r->parts, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        r->parts = p;
        r->partcap = cap;
    }
    r->parts[r->nparts++] = (mf_ckpt_part){pi, off, len, crc, want, 0};
    return 0;
}

int mf_ckpt_read(mf_ckpt_reader *r, int state, int tensor, int64_t start, int64_t end, void *dst, char *err,
                 size_t errlen)
{
    const mf_ckpt_manifest *m = &r->m;
    size_t es = mf_dtype_size(m->states[state].dtype);
    const char *base = dst;
    int64_t n = 0, first = mf_ckpt_pieces_of(m, state, tensor, &n);
    for (int64_t i = first; i < first + n && start < end; i++) {
        int64_t pi = m->by_tensor[i];
        const mf_ckpt_mpiece *p = &m->pieces[pi];
        if (p->end <= start)
            continue;
        int64_t a = start > p->start ? start : p->start, b = end < p->end ? end : p->end;
        if (mf_ckpt_read_open_file(r, p->file, err, errlen) != 0)
            return -1;
        char *to = (char *)dst + (size_t)(a - start) * es;
        size_t bytes = (size_t)(b - a) * es;
        uint32_t crc = 0;
        if (mf_ckpt_dio_fetch(r, p->file, p->offset + (uint64_t)(a - p->start) * es, bytes, to, (size_t)(to - base),
                              &crc) != 0)
            return snprintf(err, errlen, "%s/%s: read error: %s", r->dir, m->files[p->file].name,
                            strerror(errno)), -1;
        r->bytes_read += bytes;
        uint32_t want = r->f[p->file].crc[pi - m->files[p->file].first];
        if ((a != p->start || b != p->end) &&
            mf_ckpt_note_part(r, pi, (uint64_t)(a - p->start) * es, bytes, crc, want) != 0)
            return snprintf(err, errlen, "%s: out of memory", r->dir), -1;
        if (a == p->start && b == p->end && crc != want) {
            char name[1200];
            mf_ckpt_manifest_piece_name(m, p, name, sizeof name);
            return snprintf(err, errlen, "%s/%s: entry '%s' fails its CRC-32C: the file is corrupt", r->dir,
                            m->files[p->file].name, name), -1;
        }
        dst = (char *)dst + (size_t)(b - start) * es;
        start = b;
    }
    if (start < end)
        return snprintf(err, errlen, "%s: elements [%lld, %lld) of %s of '%s' are stored nowhere", r->dir,
                        (long long)start, (long long)end, m->states[state].name, m->tensors[tensor].name), -1;
    return 0;
}

int mf_ckpt_read_blob(mf_ckpt_reader *r, int64_t rank, void *buf, size_t cap, size_t *len, char *err,
                      size_t errlen)
{
    *len = 0;
    for (int f = 0; f < r->m.nfiles; f++) {
        const mf_ckpt_mfile *mf = &r->m.files[f];
        if (mf->rank != rank || !mf->blob_bytes)
            continue;
        *len = (size_t)mf->blob_bytes;
        if (!buf || cap == 0)
            return 0;
        if (mf_ckpt_read_open_file(r, f, err, errlen) != 0)
            return -1;
        size_t k = cap < *len ? cap : *len;
        if (mf_ckpt_io_pread_all(r->f[f].fd, buf, k, mf->blob_offset) != 0)
            return snprintf(err, errlen, "%s/%s: read error: %s", r->dir, mf->name, strerror(errno)), -1;
        r->bytes_read += k;
        /* A blob read in part is checked whole: the rest is read too. */
        uint32_t crc = mf_ckpt_crc_update(0, buf, k);
        char rest[4096];
        for (size_t at = k; at < *len;) {
            size_t n = *len - at < sizeof rest ? *len - at : sizeof rest;
            if (mf_ckpt_io_pread_all(r->f[f].fd, rest, n, mf->blob_offset + at) != 0)
                return snprintf(err, errlen, "%s/%s: read error: %s", r->dir, mf->name, strerror(errno)), -1;
            crc = mf_ckpt_crc_update(crc, rest, n);
            r->bytes_read += n;
            at += n;
        }
        if (crc != r->f[f].crc[mf->npieces])
            return snprintf(err, errlen, "%s/%s: the user blob fails its CRC-32C: the file is corrupt", r->dir,
                            mf->name), -1;
        return 0;
    }
    return 0;
}

int mf_ckpt_read_verify_file(mf_ckpt_reader *r, int f, char *err, size_t errlen)
{
    const mf_ckpt_mfile *mf = &r->m.files[f];
    if (mf_ckpt_read_open_file(r, f, err, errlen) != 0)
        return -1;
    uint8_t *buf = malloc(MF_CKPT_IO_CHUNK);
    if (!buf)
        return snprintf(err, errlen, "out of memory"), -1;
    /* Walk the file once: the file CRC over everything, a piece CRC per
     * entry (entries tile the data section in order). */
    int nent = mf->npieces + (mf->blob_bytes ? 1 : 0), cur = -1, rc = -1;
    uint32_t fcrc = 0, pcrc = 0;
    uint64_t data_start = mf->npieces ? r->m.pieces[mf->first].offset : mf->blob_offset;
    if (nent == 0)
        data_start = mf->bytes;
    uint64_t next_end = data_start;
    for (uint64_t at = 0; at < mf->bytes;) {
        size_t k = mf->bytes - at > MF_CKPT_IO_CHUNK ? MF_CKPT_IO_CHUNK : (size_t)(mf->bytes - at);
        if (at < data_start && at + k > data_start)
            k = (size_t)(data_start - at);
        if (cur >= 0 && cur < nent && at + k > next_end)
            k = (size_t)(next_end - at);
        if (mf_ckpt_io_pread_all(r->f[f].fd, buf, k, at) != 0) {
            snprintf(err, errlen, "%s/%s: read error: %s", r->dir, mf->name, strerror(errno));
            goto done;
        }
        fcrc = mf_ckpt_crc_update(fcrc, buf, k);
        if (cur >= 0)
            pcrc = mf_ckpt_crc_update(pcrc, buf, k);
        at += k;
        while (at >= next_end && at >= data_start && cur < nent) {
            if (cur >= 0 && pcrc != r->f[f].crc[cur]) {
                snprintf(err, errlen, "%s/%s: entry %d fails its CRC-32C: the file is corrupt", r->dir, mf->name,
                         cur);
                goto done;
            }
            if (++cur >= nent)
                break;
            pcrc = 0;
            uint64_t b = cur < mf->npieces ? (uint64_t)(r->m.pieces[mf->first + cur].end -
                                                        r->m.pieces[mf->first + cur].start) *
                                                 mf_dtype_size(r->m.states[r->m.pieces[mf->first + cur].state].dtype)
                                           : mf->blob_bytes;
            next_end += b;
        }
    }
    if (fcrc != mf->crc32c) {
        snprintf(err, errlen, "%s/%s: CRC-32C %08x, the manifest says %08x: the file is corrupt or from another "
                 "save", r->dir, mf->name, fcrc, mf->crc32c);
        goto done;
    }
    r->bytes_read += mf->bytes;
    rc = 0;
done:
    free(buf);
    return rc;
}
