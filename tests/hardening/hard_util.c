/*
 * hard_util: see hard_util.h.
 */
#include "hard_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *hard_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = n;
    }
    return buf;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int hard_list(const char *dir, const char *suffix, char **out, int max)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    size_t sl = strlen(suffix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        size_t l = strlen(e->d_name);
        if (l <= sl || strcmp(e->d_name + l - sl, suffix) != 0)
            continue;
        size_t need = strlen(dir) + l + 2;
        out[n] = malloc(need);
        if (!out[n])
            break;
        snprintf(out[n], need, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    qsort(out, (size_t)n, sizeof *out, cmp_str);
    return n;
}

uint64_t hard_rand(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15u;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1du;
}

bool hard_located(const char *msg, const char *name, int max_line, int *line)
{
    size_t nl = strlen(name);
    if (strncmp(msg, name, nl) != 0 || msg[nl] != ':')
        return false;
    char *end;
    long l = strtol(msg + nl + 1, &end, 10);
    if (end == msg + nl + 1 || *end != ':' || l < 1 || l > max_line)
        return false;
    const char *p = end + 1;
    long c = strtol(p, &end, 10);
    if (end == p || c < 1 || strncmp(end, ": error: ", 9) != 0 || !end[9])
        return false;
    if (line)
        *line = (int)l;
    return true;
}

int hard_line_of(const char *text, size_t at)
{
    int line = 1;
    for (size_t i = 0; i < at; i++)
        line += text[i] == '\n';
    return line;
}
