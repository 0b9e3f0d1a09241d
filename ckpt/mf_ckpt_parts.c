/*
 * mf_ckpt_parts: the CRC check of pieces read in part (docs/checkpoint.md,
 * "Who reads what"). A resharding load cuts the checkpoint's pieces where
 * the loading layout's ranges end, so a piece may be read by several ranks,
 * each taking a part; a piece's CRC-32C is then formed from the parts' CRCs
 * (mf_ckpt_crc_combine: no byte is read twice) once every part is known, and
 * any bytes that no reader took are read by the checking rank. Each piece is
 * checked by exactly one rank: the reader of its first part.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_ckpt_crc.h"
#include "mf_ckpt_io.h"
#include "mf_int.h"

static int mf_ckpt_part_cmp(const void *pa, const void *pb)
{
    const mf_ckpt_part *a = pa, *b = pb;
    /* by piece, offset, the longer first, rank */
    return mf_cmp_keys((const int64_t[]){a->piece, (int64_t)a->off, -(int64_t)a->len, a->rank},
                       (const int64_t[]){b->piece, (int64_t)b->off, -(int64_t)b->len, b->rank}, 4);
}

/* The CRC of bytes [off, off + len) of piece pi, read now through buf
 * (MF_CKPT_READ_CHUNK bytes). 0 or -1 with a message. */
static int mf_ckpt_read_gap(mf_ckpt_reader *r, int64_t pi, uint64_t off, uint64_t len, char *buf, uint32_t *crc,
                            char *err, size_t errlen)
{
    const mf_ckpt_mpiece *p = &r->m.pieces[pi];
    if (mf_ckpt_read_open_file(r, p->file, err, errlen) != 0)
        return -1;
    *crc = 0;
    for (uint64_t at = 0; at < len;) {
        size_t k = len - at < MF_CKPT_READ_CHUNK ? (size_t)(len - at) : MF_CKPT_READ_CHUNK;
        if (mf_ckpt_io_pread_all(r->f[p->file].fd, buf, k, p->offset + off + at) != 0)
            return snprintf(err, errlen, "%s/%s: read error: %s", r->dir, r->m.files[p->file].name,
                            strerror(errno)), -1;
        *crc = mf_ckpt_crc_update(*crc, buf, k);
        at += k;
    }
    r->bytes_read += len;
    return 0;
}

/* Checks piece parts[0].piece from its n sorted parts. */
static int mf_ckpt_piece_check(mf_ckpt_reader *r, const mf_ckpt_part *parts, int64_t n, char **buf, char *err,
                               size_t errlen)
{
    const mf_ckpt_manifest *m = &r->m;
    int64_t pi = parts[0].piece;
    const mf_ckpt_mpiece *p = &m->pieces[pi];
    uint64_t bytes = (uint64_t)(p->end - p->start) * mf_dtype_size(m->states[p->state].dtype), at = 0;
    uint32_t crc = 0, gap;
    char name[1200];
    mf_ckpt_manifest_piece_name(m, p, name, sizeof name);
    const char *file = m->files[p->file].name;
    for (int64_t j = 0; j <= n; j++) {
        uint64_t next = j < n ? parts[j].off : bytes;
        if (j < n && (next + parts[j].len > bytes || parts[j].want != parts[0].want))
            return snprintf(err, errlen, "%s/%s: entry '%s': rank %lld read bytes [%llu, %llu) of it, which has "
                            "%llu (or another CRC)", r->dir, file, name, (long long)parts[j].rank,
                            (unsigned long long)next, (unsigned long long)(next + parts[j].len),
                            (unsigned long long)bytes), -1;
        if (next < at) { /* replicas that do not share reads take the same part */
            const mf_ckpt_part *prev = &parts[j - 1];
            if (parts[j].off != prev->off || parts[j].len != prev->len)
                return snprintf(err, errlen, "%s/%s: entry '%s': ranks %lld and %lld read overlapping parts of it",
                                r->dir, file, name, (long long)prev->rank, (long long)parts[j].rank), -1;
            if (parts[j].crc != prev->crc)
                return snprintf(err, errlen, "%s/%s: entry '%s': ranks %lld and %lld read different bytes: the file "
                                "changed during the load", r->dir, file, name, (long long)prev->rank,
                                (long long)parts[j].rank), -1;
            continue;
        }
        if (next > at) {
            if (!*buf && !(*buf = malloc(MF_CKPT_READ_CHUNK)))
                return snprintf(err, errlen, "out of memory"), -1;
            if (mf_ckpt_read_gap(r, pi, at, next - at, *buf, &gap, err, errlen) != 0)
                return -1;
            crc = mf_ckpt_crc_combine(crc, gap, next - at);
            at = next;
        }
        if (j < n) {
            crc = mf_ckpt_crc_combine(crc, parts[j].crc, parts[j].len);
            at += parts[j].len;
        }
    }
    if (crc != parts[0].want)
        return snprintf(err, errlen, "%s/%s: entry '%s' fails its CRC-32C (read in part): the file is corrupt", r->dir,
                        file, name), -1;
    return 0;
}

int mf_ckpt_parts_check(mf_ckpt_reader *r, mf_ckpt_part *parts, int64_t n, int64_t me, char *err, size_t errlen)
{
    if (n > 1)
        qsort(parts, (size_t)n, sizeof *parts, mf_ckpt_part_cmp);
    char *buf = NULL;
    int rc = 0;
    for (int64_t i = 0, j; i < n && rc == 0; i = j) {
        for (j = i + 1; j < n && parts[j].piece == parts[i].piece;)
            j++;
        if (parts[i].piece < 0 || parts[i].piece >= r->m.npieces) {
            snprintf(err, errlen, "%s: rank %lld read a piece the manifest does not have", r->dir,
                     (long long)parts[i].rank);
            rc = -1;
            break;
        }
        if (parts[i].rank == me)
            rc = mf_ckpt_piece_check(r, parts + i, j - i, &buf, err, errlen);
    }
    free(buf);
    return rc;
}
