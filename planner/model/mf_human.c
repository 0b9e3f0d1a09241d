/*
 * mf_human: byte counts in binary units (see mf_human.h).
 */
#include "mf_human.h"

#include <stdio.h>

char *mf_human_bytes_digits(int64_t bytes, int digits, char *buf, size_t size)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%lld B", (long long)bytes);
    else
        snprintf(buf, size, "%.*f %s", digits, v, unit[u]);
    return buf;
}

char *mf_human_bytes(int64_t bytes, char *buf, size_t size)
{
    return mf_human_bytes_digits(bytes, 1, buf, size);
}
