/*
 * mf_ckpt_st: safetensors headers: parse (bounded, every offset checked) and
 * build, and the one table of the schedule dtypes as safetensors names them.
 * JSON through jansson; nothing here touches tensor data.
 */
#include "mf_ckpt_st.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mf_diag.h"
#include "mf_int.h"

static const struct {
    const char *name;
    size_t size;
} mf_st_dtypes[] = {
#define MF_ST_ROW(E, s) {#E, s},
    MF_ST_DTYPE_LIST(MF_ST_ROW)
#undef MF_ST_ROW
};

const char *mf_st_dtype_name(mf_st_dtype d)
{
    return (unsigned)d < MF_ST_DTYPE_COUNT ? mf_st_dtypes[d].name : NULL;
}

size_t mf_st_dtype_size(mf_st_dtype d)
{
    return (unsigned)d < MF_ST_DTYPE_COUNT ? mf_st_dtypes[d].size : 0;
}

int mf_st_dtype_from_name(const char *s)
{
    for (int i = 0; s && i < MF_ST_DTYPE_COUNT; i++)
        if (strcmp(s, mf_st_dtypes[i].name) == 0)
            return i;
    return -1;
}

/* A failure: its message into err (core's mf_diag_errf), and -1. */
#define mf_st_err(...) (mf_diag_errf(__VA_ARGS__), -1)

void mf_ckpt_st_free(mf_st_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n; i++)
        free(f->e[i].name);
    for (int i = 0; i < f->nmeta; i++) {
        free(f->meta_key[i]);
        free(f->meta_val[i]);
    }
    free(f->e);
    free(f->meta_key);
    free(f->meta_val);
    memset(f, 0, sizeof *f);
}

static int mf_st_cmp(const void *a, const void *b)
{
    const mf_st_entry *x = a, *y = b;
    int c = mf_cmp_i64((int64_t)x->begin, (int64_t)y->begin);
    return c ? c : mf_cmp_i64((int64_t)x->end, (int64_t)y->end);
}

/* A non-negative JSON integer, or -1. */
static int64_t mf_st_uint(const json_t *v)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    return (int64_t)json_integer_value(v);
}

static int mf_st_entry_parse(const char *fname, const char *key, json_t *v, mf_st_entry *e, char *err,
                             size_t errlen)
{
    if (!json_is_object(v))
        return mf_st_err(err, errlen, "%s: tensor '%s': not an object", fname, key);
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    int d = mf_st_dtype_from_name(dt);
    if (d < 0)
        return mf_st_err(err, errlen, "%s: tensor '%s': unknown or missing dtype '%s'", fname, key,
                         dt ? dt : "");
    json_t *shape = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
    if (!json_is_array(shape) || json_array_size(shape) > MF_ST_MAX_DIMS)
        return mf_st_err(err, errlen, "%s: tensor '%s': shape must be an array of at most %d sizes",
                         fname, key, MF_ST_MAX_DIMS);
    if (!json_is_array(off) || json_array_size(off) != 2)
        return mf_st_err(err, errlen, "%s: tensor '%s': data_offsets must be [begin, end]", fname, key);
    e->dtype = (mf_st_dtype)d;
    e->ndims = (int)json_array_size(shape);
    e->numel = 1;
    for (int i = 0; i < e->ndims; i++) {
        int64_t n = mf_st_uint(json_array_get(shape, (size_t)i));
        if (n < 0)
            return mf_st_err(err, errlen, "%s: tensor '%s': shape[%d] is not a size", fname, key, i);
        if (n && e->numel > INT64_MAX / 16 / n)
            return mf_st_err(err, errlen, "%s: tensor '%s': shape overflows", fname, key);
        e->shape[i] = n;
        e->numel *= n;
    }
    int64_t b = mf_st_uint(json_array_get(off, 0)), en = mf_st_uint(json_array_get(off, 1));
    if (b < 0 || en < 0 || en < b)
        return mf_st_err(err, errlen, "%s: tensor '%s': data_offsets are not [begin, end] with begin <= end",
                         fname, key);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    if ((uint64_t)e->numel * mf_st_dtype_size(e->dtype) != e->end - e->begin)
        return mf_st_err(err, errlen,
                         "%s: tensor '%s': %lld elements of %s are %llu bytes, data_offsets [%llu, %llu) "
                         "hold %llu",
                         fname, key, (long long)e->numel, dt, (unsigned long long)e->numel * mf_st_dtype_size(e->dtype),
                         (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)(e->end - e->begin));
    e->name = strdup(key);
    if (!e->name)
        return mf_st_err(err, errlen, "%s: out of memory", fname);
    return 0;
}

static int mf_st_meta_parse(const char *fname, json_t *v, mf_st_file *f, char *err, size_t errlen)
{
    if (!json_is_object(v))
        return mf_st_err(err, errlen, "%s: __metadata__ is not an object", fname);
    size_t n = json_object_size(v);
    f->meta_key = calloc(n ? n : 1, sizeof *f->meta_key);
    f->meta_val = calloc(n ? n : 1, sizeof *f->meta_val);
    if (!f->meta_key || !f->meta_val)
        return mf_st_err(err, errlen, "%s: out of memory", fname);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (!json_is_string(x))
            return mf_st_err(err, errlen, "%s: __metadata__ value of '%s' is not a string", fname, k);
        f->meta_key[f->nmeta] = strdup(k);
        f->meta_val[f->nmeta] = strdup(json_string_value(x));
        f->nmeta++;
        if (!f->meta_key[f->nmeta - 1] || !f->meta_val[f->nmeta - 1])
            return mf_st_err(err, errlen, "%s: out of memory", fname);
    }
    return 0;
}

/* Sorted entries must tile [0, data_len) exactly. */
static int mf_st_check_tiling(const char *fname, const mf_st_file *f, char *err, size_t errlen)
{
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        const mf_st_entry *e = &f->e[i];
        if (e->begin < at)
            return mf_st_err(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu) overlap tensor '%s'",
                             fname, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                             f->e[i - 1].name);
        if (e->begin > at)
            return mf_st_err(err, errlen,
                             "%s: tensor '%s': data_offsets [%llu, %llu) leave a gap of %llu bytes before it",
                             fname, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                             (unsigned long long)(e->begin - at));
        if (e->end > f->data_len)
            return mf_st_err(err, errlen,
                             "%s: tensor '%s': data_offsets [%llu, %llu) run past the end of the data "
                             "(%llu bytes)",
                             fname, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                             (unsigned long long)f->data_len);
        at = e->end;
    }
    if (at != f->data_len)
        return mf_st_err(err, errlen, "%s: the tensors cover %llu of the data section's %llu bytes", fname,
                         (unsigned long long)at, (unsigned long long)f->data_len);
    return 0;
}

int mf_ckpt_st_parse(const char *fname, const char *json, size_t len, uint64_t data_len, mf_st_file *out,
                     char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->header_len = len;
    out->data_start = 8 + (uint64_t)len;
    out->data_len = data_len;
    if (len > MF_ST_MAX_HEADER)
        return mf_st_err(err, errlen, "%s: header of %zu bytes exceeds the limit of %u", fname, len,
                         MF_ST_MAX_HEADER);
    if (len == 0 || json[0] != '{')
        return mf_st_err(err, errlen, "%s: header does not start with '{'", fname);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return mf_st_err(err, errlen, "%s: header: line %d, column %d: %s", fname, je.line, je.column,
                         je.text);
    int rc = -1;
    if (!json_is_object(root)) {
        mf_diag_errf(err, errlen, "%s: header is not a JSON object", fname);
        goto done;
    }
    size_t n = json_object_size(root);
    out->e = calloc(n ? n : 1, sizeof *out->e);
    if (!out->e) {
        mf_diag_errf(err, errlen, "%s: out of memory", fname);
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__") == 0) {
            if (mf_st_meta_parse(fname, v, out, err, errlen) != 0)
                goto done;
            continue;
        }
        if (mf_st_entry_parse(fname, k, v, &out->e[out->n], err, errlen) != 0)
            goto done;
        out->n++;
    }
    qsort(out->e, (size_t)out->n, sizeof *out->e, mf_st_cmp);
    rc = mf_st_check_tiling(fname, out, err, errlen);
done:
    json_decref(root);
    if (rc != 0)
        mf_ckpt_st_free(out);
    return rc;
}

int mf_ckpt_st_read(int fd, const char *fname, uint64_t file_size, mf_st_file *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    uint8_t lenb[8];
    if (file_size < 8)
        return mf_st_err(err, errlen, "%s: %llu bytes is too short for a safetensors file", fname,
                         (unsigned long long)file_size);
    if (pread(fd, lenb, 8, 0) != 8)
        return mf_st_err(err, errlen, "%s: cannot read the header length: %s", fname, strerror(errno));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | lenb[i];
    if (n > MF_ST_MAX_HEADER)
        return mf_st_err(err, errlen, "%s: header length %llu exceeds the limit of %u bytes", fname,
                         (unsigned long long)n, MF_ST_MAX_HEADER);
    if (n > file_size - 8)
        return mf_st_err(err, errlen, "%s: header length %llu runs past the end of the file (%llu bytes)",
                         fname, (unsigned long long)n, (unsigned long long)file_size);
    char *json = malloc(n ? n : 1);
    if (!json)
        return mf_st_err(err, errlen, "%s: out of memory", fname);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, json + got, n - got, (off_t)(8 + got));
        if (r <= 0) {
            free(json);
            return mf_st_err(err, errlen, "%s: cannot read the header: %s", fname,
                             r == 0 ? "unexpected end of file" : strerror(errno));
        }
        got += (size_t)r;
    }
    int rc = mf_ckpt_st_parse(fname, json, n, file_size - 8 - n, out, err, errlen);
    free(json);
    return rc;
}

const mf_st_entry *mf_ckpt_st_find(const mf_st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->e[i].name, name) == 0)
            return &f->e[i];
    return NULL;
}

const char *mf_ckpt_st_meta(const mf_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_key[i], key) == 0)
            return f->meta_val[i];
    return NULL;
}

static json_t *mf_st_entry_json(const mf_st_entry *e)
{
    json_t *o = json_object(), *shape = json_array(), *off = json_array();
    if (!o || !shape || !off) {
        json_decref(o);
        json_decref(shape);
        json_decref(off);
        return NULL;
    }
    for (int d = 0; d < e->ndims; d++)
        json_array_append_new(shape, json_integer(e->shape[d]));
    json_array_append_new(off, json_integer((json_int_t)e->begin));
    json_array_append_new(off, json_integer((json_int_t)e->end));
    json_object_set_new(o, "dtype", json_string(mf_st_dtype_name(e->dtype)));
    json_object_set_new(o, "shape", shape);
    json_object_set_new(o, "data_offsets", off);
    return o;
}

int mf_ckpt_st_build(const mf_st_entry *e, int n, const char *const *meta_key, const char *const *meta_val,
                     int nmeta, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    json_t *root = json_object();
    int rc = -1;
    char *text = NULL;
    if (!root)
        return -1;
    if (nmeta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0)
            goto done;
        for (int i = 0; i < nmeta; i++)
            if (json_object_set_new(m, meta_key[i], json_string(meta_val[i])) != 0)
                goto done;
    }
    for (int i = 0; i < n; i++) {
        json_t *o = mf_st_entry_json(&e[i]);
        if (!o || json_object_set_new(root, e[i].name, o) != 0)
            goto done;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text)
        goto done;
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    uint8_t *buf = malloc(8 + padded);
    if (!buf)
        goto done;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len);
    *out = buf;
    *out_len = 8 + padded;
    rc = 0;
done:
    free(text);
    json_decref(root);
    return rc;
}

/* The schedule's dtypes as safetensors names them: the one table of both
 * directions. */
static const struct {
    mf_dtype d;
    mf_st_dtype st;
} mf_ckpt_st_dtypes[] = {{MF_FP32, MF_ST_F32}, {MF_BF16, MF_ST_BF16}, {MF_FP16, MF_ST_F16}};

mf_st_dtype mf_ckpt_st_dtype(mf_dtype d)
{
    for (size_t i = 0; i < sizeof mf_ckpt_st_dtypes / sizeof *mf_ckpt_st_dtypes; i++)
        if (mf_ckpt_st_dtypes[i].d == d)
            return mf_ckpt_st_dtypes[i].st;
    return MF_ST_F32;
}

int mf_ckpt_st_sched_dtype(mf_st_dtype st)
{
    for (size_t i = 0; i < sizeof mf_ckpt_st_dtypes / sizeof *mf_ckpt_st_dtypes; i++)
        if (mf_ckpt_st_dtypes[i].st == st)
            return (int)mf_ckpt_st_dtypes[i].d;
    return -1;
}
