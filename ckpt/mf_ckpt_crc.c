/*
 * mf_ckpt_crc: CRC-32C, hardware (SSE4.2) or table, and CRC combination by
 * multiplication with x^(8n) modulo the polynomial (the method of zlib's
 * crc32_combine, in the reflected bit order).
 */
#include "mf_ckpt_crc.h"

#include <pthread.h>
#include <string.h>

#define MF_CRC32C_POLY 0x82f63b78u

static uint32_t mf_crc_table[8][256];
static pthread_once_t mf_crc_once = PTHREAD_ONCE_INIT;
static int mf_crc_hw;

static void mf_crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ MF_CRC32C_POLY : c >> 1;
        mf_crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            mf_crc_table[t][n] = (mf_crc_table[t - 1][n] >> 8) ^ mf_crc_table[0][mf_crc_table[t - 1][n] & 0xff];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    mf_crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

/* Slicing-by-8 over the table; c is the running (pre-inverted) value. */
static uint32_t mf_crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = mf_crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = mf_crc_table[7][w & 0xff] ^ mf_crc_table[6][(w >> 8) & 0xff] ^
            mf_crc_table[5][(w >> 16) & 0xff] ^ mf_crc_table[4][(w >> 24) & 0xff] ^
            mf_crc_table[3][(w >> 32) & 0xff] ^ mf_crc_table[2][(w >> 40) & 0xff] ^
            mf_crc_table[1][(w >> 48) & 0xff] ^ mf_crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = mf_crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The crc32 instruction, 8 bytes at a time; c is the running value. */
__attribute__((target("sse4.2"))) static uint32_t mf_crc_hw_run(uint32_t c, const uint8_t *p, size_t n)
{
    uint64_t c64 = c;
    while (n && ((uintptr_t)p & 7)) {
        c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
    return (uint32_t)c64;
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Three independent chains over the thirds of a large buffer hide the
 * instruction's 3-cycle latency; the thirds' CRCs are then combined. */
__attribute__((target("sse4.2"))) static uint32_t mf_crc_hw3(uint32_t crc, const uint8_t *p, size_t n)
{
    size_t third = (n / 3) & ~(size_t)7;
    const uint8_t *a = p, *b = p + third, *c = p + 2 * third;
    uint64_t ca = ~crc, cb = 0xffffffffu, cc = 0xffffffffu;
    for (size_t i = 0; i < third; i += 8) {
        uint64_t wa, wb, wc;
        memcpy(&wa, a + i, 8);
        memcpy(&wb, b + i, 8);
        memcpy(&wc, c + i, 8);
        ca = __builtin_ia32_crc32di(ca, wa);
        cb = __builtin_ia32_crc32di(cb, wb);
        cc = __builtin_ia32_crc32di(cc, wc);
    }
    uint32_t rest = ~mf_crc_hw_run((uint32_t)cc, c + third, n - 3 * third);
    uint32_t ab = mf_ckpt_crc_combine(~(uint32_t)ca, ~(uint32_t)cb, third);
    return mf_ckpt_crc_combine(ab, rest, n - 2 * third);
}
#endif

uint32_t mf_ckpt_crc_update(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&mf_crc_once, mf_crc_init);
    uint32_t c = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (mf_crc_hw && len >= ((size_t)64 << 10))
        return mf_crc_hw3(crc, data, len);
    if (mf_crc_hw)
        return ~mf_crc_hw_run(c, data, len);
#endif
    return ~mf_crc_sw(c, data, len);
}

/* a * b modulo the polynomial (reflected: bit 31 is x^0). */
static uint32_t mf_crc_multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ MF_CRC32C_POLY : b >> 1;
    }
    return p;
}

/* x^(8 * n) modulo the polynomial, by repeated squaring. */
static uint32_t mf_crc_x8nmodp(uint64_t n)
{
    uint32_t p = 1u << 31;  /* x^0 */
    uint32_t sq = 1u << 23; /* x^8 */
    while (n) {
        if (n & 1)
            p = mf_crc_multmodp(sq, p);
        sq = mf_crc_multmodp(sq, sq);
        n >>= 1;
    }
    return p;
}

uint32_t mf_ckpt_crc_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    return mf_crc_multmodp(mf_crc_x8nmodp(len_b), crc_a) ^ crc_b;
}
