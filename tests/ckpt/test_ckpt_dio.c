/*
 * How a checkpoint reader gets a data file's bytes (ckpt/mf_ckpt_dio.c):
 * ranges of a file of random bytes (not a multiple of any block size) are
 * fetched warm (in the page cache: plain reads, no direct read), cold (after
 * POSIX_FADV_DONTNEED: O_DIRECT through the bounce buffer, where the file
 * system does direct I/O) in file order and scattered, and with direct reads
 * forced to fail (alignment 1: EINVAL, the file turns to plain reads). Every
 * time the bytes, the CRC-32C (against the CRC of the expected bytes, from
 * the table-free definition below) and what the chunk callback saw must equal
 * the file's own bytes, and a cold read in file order must read each byte
 * from the disk about once (direct_bytes, within the alignment and the
 * smallest direct read).
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "mf_ckpt_io.h"

#define FILE_BYTES (((size_t)13 << 20) + 12345)

static char g_path[4096];
static unsigned char *g_data;   /* the file's bytes */
static unsigned char *g_seen;   /* what the chunk callback was given, by position */

/* CRC-32C bit by bit (reflected 0x82f63b78), continuing like mf_ckpt_crc_update. */
static uint32_t crc_ref(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int b = 0; b < 8; b++)
            crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static void on_chunk(void *ctx, size_t off, const void *data, size_t n)
{
    (void)ctx;
    memcpy(g_seen + off, data, n);
}

static void drop_cache(void)
{
    int fd = open(g_path, O_RDONLY);
    assert_true(fd >= 0);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static void reader_open(mf_ckpt_reader *r, mf_ckpt_rfile *rf)
{
    memset(r, 0, sizeof *r);
    memset(rf, 0, sizeof *rf);
    r->f = rf;
    r->bfile = -1;
    r->chunk = on_chunk;
    rf->fd = open(g_path, O_RDONLY);
    assert_true(rf->fd >= 0);
    mf_ckpt_dio_open(rf, g_path, FILE_BYTES);
}

static void reader_close(mf_ckpt_reader *r)
{
    mf_ckpt_dio_close(r->f);
    close(r->f->fd);
    free(r->bounce);
}

/* Fetches [off, off + n) and checks bytes, CRC and callback. */
static void fetch(mf_ckpt_reader *r, uint64_t off, size_t n)
{
    unsigned char *dst = malloc(n + 1);
    assert_non_null(dst);
    memset(g_seen, 0xa5, n + 1);
    uint32_t crc = 0;
    assert_int_equal(mf_ckpt_dio_fetch(r, 0, off, n, (char *)dst, 0, &crc), 0);
    assert_memory_equal(dst, g_data + off, n);
    assert_memory_equal(g_seen, g_data + off, n);
    assert_int_equal(crc, crc_ref(0, g_data + off, n));
    free(dst);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_path, sizeof g_path, "test_ckpt_dio.%ld.bin", (long)getpid());
    g_data = malloc(FILE_BYTES);
    g_seen = malloc(FILE_BYTES + 1);
    if (!g_data || !g_seen)
        return -1;
    srand(7);
    for (size_t i = 0; i < FILE_BYTES; i++)
        g_data[i] = (unsigned char)(rand() >> 7);
    int fd = open(g_path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0 || mf_ckpt_io_pwrite_all(fd, g_data, FILE_BYTES, 0) != 0 || fsync(fd) != 0)
        return -1;
    close(fd);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_path);
    free(g_data);
    free(g_seen);
    return 0;
}

/* Ranges in file order, like a load's pieces: small and large, unaligned. */
static const uint64_t g_cuts[] = {0, 8, 4096, 5000, 5001, 70000, ((uint64_t)3 << 20) + 7, ((uint64_t)4 << 20) - 1,
                                  ((uint64_t)9 << 20) + 333, ((uint64_t)9 << 20) + 400, FILE_BYTES - 5, FILE_BYTES};

/* All cached: nothing is read past the page cache. The kernel may evict a
 * page between the warming read and the fetch (reclaim while parallel tests
 * write gigabytes), so a try that read directly is retried; a reader that
 * mistook cached pages for uncached ones reads directly on every try. */
static void test_warm(void **state)
{
    (void)state;
    uint64_t direct = 0;
    for (int attempt = 0; attempt < 5; attempt++) {
        mf_ckpt_reader r;
        mf_ckpt_rfile rf;
        int fd = open(g_path, O_RDONLY); /* make every page cached */
        unsigned char *tmp = malloc(FILE_BYTES);
        assert_int_equal(mf_ckpt_io_pread_all(fd, tmp, FILE_BYTES, 0), 0);
        free(tmp);
        close(fd);
        reader_open(&r, &rf);
        for (size_t i = 0; i + 1 < sizeof g_cuts / sizeof *g_cuts; i++)
            fetch(&r, g_cuts[i], (size_t)(g_cuts[i + 1] - g_cuts[i]));
        direct = r.direct_bytes;
        reader_close(&r);
        if (direct == 0)
            break;
        print_message("try %d: %llu bytes read directly (pages evicted?); again\n", attempt + 1,
                      (unsigned long long)direct);
    }
    assert_int_equal(direct, 0);
}

static void test_cold_in_order(void **state)
{
    (void)state;
    mf_ckpt_reader r;
    mf_ckpt_rfile rf;
    drop_cache();
    reader_open(&r, &rf);
    int direct = rf.dfd >= 0;
    for (size_t i = 0; i + 1 < sizeof g_cuts / sizeof *g_cuts; i++)
        fetch(&r, g_cuts[i], (size_t)(g_cuts[i + 1] - g_cuts[i]));
    if (direct) { /* each byte from the disk about once */
        print_message("direct reads: %llu bytes for a file of %llu\n", (unsigned long long)r.direct_bytes,
                      (unsigned long long)FILE_BYTES);
        assert_true(r.direct_bytes >= FILE_BYTES - 4096 && r.direct_bytes <= FILE_BYTES + ((uint64_t)1 << 20));
    } else {
        print_message("this file system does not do direct I/O: plain reads checked\n");
        assert_int_equal(r.direct_bytes, 0);
    }
    reader_close(&r);
}

static void test_cold_scattered(void **state)
{
    (void)state;
    mf_ckpt_reader r;
    mf_ckpt_rfile rf;
    drop_cache();
    reader_open(&r, &rf);
    srand(11);
    for (int i = 0; i < 60; i++) {
        uint64_t off = (uint64_t)rand() % FILE_BYTES;
        size_t n = (size_t)((uint64_t)rand() % (i % 3 == 0 ? ((uint64_t)6 << 20) : 9000)) + 1;
        n = off + n > FILE_BYTES ? (size_t)(FILE_BYTES - off) : n;
        fetch(&r, off, n);
        if (i % 10 == 9)
            drop_cache();
    }
    reader_close(&r);
}

static void test_fallback(void **state)
{
    (void)state;
    mf_ckpt_reader r;
    mf_ckpt_rfile rf;
    drop_cache();
    reader_open(&r, &rf);
    if (rf.dfd < 0) {
        reader_close(&r);
        skip();
    }
    rf.align = 1; /* unaligned direct reads: EINVAL, then plain reads */
    fetch(&r, 4097, 100000);
    assert_int_equal(rf.dfd, -1);
    assert_int_equal(r.direct_bytes, 0);
    fetch(&r, 0, FILE_BYTES);
    reader_close(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warm),
        cmocka_unit_test(test_cold_in_order),
        cmocka_unit_test(test_cold_scattered),
        cmocka_unit_test(test_fallback),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
