/*
 * mf_ckpt_dio: how a checkpoint reader gets a data file's bytes
 * (docs/checkpoint.md, "Reading from the disk").
 *
 * A byte range goes to the caller's memory one of two ways, chosen per
 * 2 MiB chunk by whether the file's pages are in the page cache (mincore on
 * a read-only mapping of the file: it starts no I/O):
 *
 * - cached (a warm load, e.g. right after a save): pread into the
 *   destination, CRC'd while in the CPU's cache, as before;
 * - not cached (a cold load): O_DIRECT reads of up to 4 MiB into the
 *   reader's bounce buffer (aligned to 2 MiB and asked to be backed by
 *   huge pages, so that a request is a few large segments, not 1024 pages),
 *   then, 256 KiB at a time while in cache, CRC, copy to the destination and
 *   the reader's chunk callback. The page cache is skipped: no page
 *   allocation, no kernel copy. The bounce window is kept, so the next
 *   range that starts in it (the next piece of the file) is served from it;
 *   the unaligned head and tail of a range are read within aligned requests.
 *
 * Direct reads are used only where they work: the file opens with O_DIRECT
 * (tmpfs on older kernels refuses: EINVAL), it is the same inode as the
 * checked one, the file system's alignment (statx STATX_DIOALIGN, else 4096)
 * fits the bounce buffer, and the file can be mapped. A direct read that
 * fails with EINVAL turns the file to plain reads for good; other errors are
 * read errors. Memory: one 4 MiB bounce buffer per reader, allocated on the
 * first direct read (and with reader->nodst a 2 MiB scratch buffer for the
 * cached path: the destination is then device memory, reached only through
 * the chunk callback).
 */
#include "mf_ckpt_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mf_ckpt_crc.h"

#define MF_CKPT_DIO_BYTES ((size_t)4 << 20)     /* bounce buffer: the largest direct read */
#define MF_CKPT_DIO_ALIGN ((size_t)2 << 20)     /* its alignment: a huge page */
#define MF_CKPT_DIO_MIN ((uint64_t)256 << 10)   /* smallest direct read (a small piece reads ahead) */
#define MF_CKPT_DIO_SUB ((size_t)256 << 10)     /* CRC + copies per step, in the CPU's cache */

/* The file system's direct-I/O alignment for fd (a power of two), or 0 when
 * it does not do direct I/O. */
static uint32_t mf_ckpt_dio_align(int fd)
{
    uint32_t al = 4096;
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (sx.stx_dio_offset_align == 0)
            return 0; /* the file system says: no direct I/O */
        al = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align : sx.stx_dio_mem_align;
        al = al < 512 ? 512 : al;
    }
#endif
    return (al & (al - 1)) == 0 && al <= MF_CKPT_DIO_ALIGN ? al : 0;
}

void mf_ckpt_dio_open(mf_ckpt_rfile *rf, const char *path, uint64_t size)
{
    rf->dfd = -1;
    rf->map = NULL;
    rf->size = size;
    struct stat a, b;
    int dfd = open(path, O_RDONLY | O_DIRECT | O_NONBLOCK | O_CLOEXEC); /* the inode is compared below */
    if (dfd < 0)
        return; /* EINVAL: the file system does not do direct I/O */
    uint32_t al = mf_ckpt_dio_align(dfd);
    void *map = size && al ? mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, rf->fd, 0) : MAP_FAILED;
    if (map == MAP_FAILED || fstat(rf->fd, &a) != 0 || fstat(dfd, &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
        if (map != MAP_FAILED)
            munmap(map, (size_t)size);
        close(dfd);
        return; /* plain reads (another inode by now would fail the CRCs anyway) */
    }
    rf->dfd = dfd;
    rf->align = al;
    rf->map = map;
}

void mf_ckpt_dio_close(mf_ckpt_rfile *rf)
{
    if (rf->dfd >= 0)
        close(rf->dfd);
    if (rf->map)
        munmap(rf->map, (size_t)rf->size);
    rf->dfd = -1;
    rf->map = NULL;
}

/* 1 when every page of bytes [off, off + n) of the file is in the page
 * cache (so a plain read costs no I/O), else 0. */
static int mf_ckpt_dio_cached(const mf_ckpt_rfile *rf, uint64_t off, size_t n)
{
    unsigned char vec[(MF_CKPT_READ_CHUNK >> 12) + 2];
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t a = off & ~(uint64_t)(pg - 1), e = off + n;
    size_t pages = (size_t)((e - a + (uint64_t)pg - 1) / (uint64_t)pg);
    if (pages > sizeof vec || mincore((char *)rf->map + a, (size_t)(e - a), vec) != 0)
        return 0;
    for (size_t i = 0; i < pages; i++)
        if (!(vec[i] & 1))
            return 0;
    return 1;
}

/* Fills the bounce window with file f's bytes from o on (aligned down),
 * want bytes wanted. 0; 1 when direct reads do not work for this file (it
 * is switched to plain reads); -1 read error (errno). */
static int mf_ckpt_dio_fill(mf_ckpt_reader *r, int f, uint64_t o, uint64_t want)
{
    mf_ckpt_rfile *rf = &r->f[f];
    if (!r->bounce) {
        if (posix_memalign((void **)&r->bounce, MF_CKPT_DIO_ALIGN, MF_CKPT_DIO_BYTES) != 0) {
            r->bounce = NULL;
            return 1;
        }
        (void)madvise(r->bounce, MF_CKPT_DIO_BYTES, MADV_HUGEPAGE); /* a hint: large segments */
    }
    uint64_t al = rf->align, a = o & ~(al - 1), end = o + (want > MF_CKPT_DIO_MIN ? want : MF_CKPT_DIO_MIN);
    end = (end + al - 1) & ~(al - 1);
    if (end - a > MF_CKPT_DIO_BYTES)
        end = a + MF_CKPT_DIO_BYTES;
    uint64_t fend = (rf->size + al - 1) & ~(al - 1);
    end = end < fend ? end : fend;
    r->bfile = -1;
    size_t got = 0;
    while (a + got < end && a + got < rf->size) {
        ssize_t k = pread(rf->dfd, r->bounce + got, (size_t)(end - a - got), (off_t)(a + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EINVAL) { /* alignment or file system: plain reads from now on */
            mf_ckpt_dio_close(rf);
            return 1;
        }
        if (k <= 0)
            return k == 0 ? (errno = EIO, -1) : -1; /* EOF before the checked size */
        got += (size_t)k;
        if (got % al != 0 && a + got < rf->size) { /* unaligned short read: finish with plain reads */
            mf_ckpt_dio_close(rf);
            return 1;
        }
    }
    r->direct_bytes += got;
    r->bfile = f;
    r->bat = a;
    r->blen = a + got < rf->size ? got : (size_t)(rf->size - a);
    return r->bat + r->blen > o ? 0 : (errno = EIO, -1);
}

/* CRC, then the chunk callback (position `at`), over data[0, n). */
static void mf_ckpt_dio_took(mf_ckpt_reader *r, const char *data, size_t at, size_t n, uint32_t *crc)
{
    *crc = mf_ckpt_crc_update(*crc, data, n);
    if (r->chunk)
        r->chunk(r->chunk_ctx, at, data, n);
}

int mf_ckpt_dio_fetch(mf_ckpt_reader *r, int f, uint64_t off, size_t n, char *dst, size_t base, uint32_t *crc)
{
    mf_ckpt_rfile *rf = &r->f[f];
    for (size_t pos = 0; pos < n;) {
        uint64_t o = off + pos;
        if (r->bfile == f && o >= r->bat && o < r->bat + r->blen) { /* in the bounce window */
            size_t k = (size_t)(r->bat + r->blen - o) < n - pos ? (size_t)(r->bat + r->blen - o) : n - pos;
            for (size_t s = 0; s < k; s += MF_CKPT_DIO_SUB) {
                size_t m = k - s < MF_CKPT_DIO_SUB ? k - s : MF_CKPT_DIO_SUB;
                const char *src = r->bounce + (o - r->bat) + s;
                *crc = mf_ckpt_crc_update(*crc, src, m);
                if (!r->nodst)
                    memcpy(dst + pos + s, src, m);
                if (r->chunk)
                    r->chunk(r->chunk_ctx, base + pos + s, r->nodst ? src : dst + pos + s, m);
            }
            pos += k;
            continue;
        }
        size_t k = n - pos < MF_CKPT_READ_CHUNK ? n - pos : MF_CKPT_READ_CHUNK;
        if (rf->dfd >= 0 && !mf_ckpt_dio_cached(rf, o, k)) {
            int rc = mf_ckpt_dio_fill(r, f, o, n - pos);
            if (rc < 0)
                return -1;
            if (rc == 0)
                continue;
        }
        if (r->nodst) { /* through the scratch buffer: dst is not host memory */
            if (!r->scratch && !(r->scratch = malloc(MF_CKPT_READ_CHUNK)))
                return errno = ENOMEM, -1;
            if (mf_ckpt_io_pread_all(rf->fd, r->scratch, k, o) != 0)
                return -1;
            mf_ckpt_dio_took(r, r->scratch, base + pos, k, crc);
        } else {
            if (mf_ckpt_io_pread_all(rf->fd, dst + pos, k, o) != 0)
                return -1;
            mf_ckpt_dio_took(r, dst + pos, base + pos, k, crc);
        }
        pos += k;
    }
    return 0;
}
