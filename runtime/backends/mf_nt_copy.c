/*
 * mf_nt_copy: copies whose destination is written with streaming
 * (non-temporal) stores, for the local backend's large collectives.
 *
 * An ordinary store to a cache line that is not in cache first reads the
 * line (read for ownership), so writing S bytes of a destination that does
 * not fit in cache moves 2 S bytes; a streaming store writes the line without
 * reading it (S bytes), which is what glibc's memcpy does for large copies.
 * On x86-64 (SSE2 is baseline there) the 16-byte aligned middle of the
 * destination is written with _mm_stream_si128; the unaligned head and tail,
 * and everything on other CPUs, with ordinary stores (the bytes written are
 * the same either way). Streaming stores are weakly ordered: the writer calls
 * mf_nt_copy_fence before another thread may read the destination.
 */
#include "mf_nt_copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>

void mf_nt_copy(void *dst, const void *src, size_t bytes)
{
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 15u);
    if (head > bytes)
        head = bytes;
    memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
        _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, bytes);
}

void mf_nt_copy_fence(void)
{
    _mm_sfence();
}

#else /* no streaming stores: ordinary copies, ordered by the caller's lock */

void mf_nt_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

void mf_nt_copy_fence(void)
{
}

#endif
