/*
 * mf_ckpt_manifest: manifest.json, dump and parse-and-check (see the header).
 */
#include "mf_ckpt_manifest.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_diag.h"
#include "mf_free.h"
#include "mf_int.h"

/* A failure: its message into err (core's mf_diag_errf), and -1. */
#define mf_mf_err(...) (mf_diag_errf(__VA_ARGS__), -1)

/* 1 when s is 1..max characters of [A-Za-z0-9_.-]. */
static int mf_mf_chars_ok(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

int mf_ckpt_manifest_state_name_ok(const char *s)
{
    return mf_mf_chars_ok(s, 64);
}

/* A file name the checkpoint may hold: no directory part, no leading dot. */
static int mf_mf_file_name_ok(const char *s)
{
    return s[0] != '.' && mf_mf_chars_ok(s, 200);
}

int mf_ckpt_manifest_piece_name(const mf_ckpt_manifest *m, const mf_ckpt_mpiece *p, char *buf, size_t size)
{
    return snprintf(buf, size, "%s:%s[%" PRId64 ":%" PRId64 "]", m->states[p->state].name,
                    m->tensors[p->tensor].name, p->start, p->end);
}

void mf_ckpt_manifest_free(mf_ckpt_manifest *m)
{
    if (!m)
        return;
    for (int a = 0; a < m->naxes; a++)
        free(m->axis_name[a]);
    for (int i = 0; m->states && i < m->nstates; i++)
        free(m->states[i].name);
    for (int i = 0; m->tensors && i < m->ntensors; i++)
        free(m->tensors[i].name);
    for (int i = 0; m->files && i < m->nfiles; i++)
        free(m->files[i].name);
    MF_FREE_ALL(m->states, m->tensors, m->files, m->pieces, m->by_tensor);
    memset(m, 0, sizeof *m);
}

int mf_ckpt_manifest_tensor(const mf_ckpt_manifest *m, const char *name)
{
    for (int i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return i;
    return -1;
}

int mf_ckpt_manifest_state(const mf_ckpt_manifest *m, const char *name)
{
    for (int i = 0; i < m->nstates; i++)
        if (strcmp(m->states[i].name, name) == 0)
            return i;
    return -1;
}

/* ---- dump ---- */

static json_t *mf_mf_files_json(const mf_ckpt_manifest *m)
{
    json_t *files = json_array();
    for (int f = 0; files && f < m->nfiles; f++) {
        const mf_ckpt_mfile *mf = &m->files[f];
        json_t *o = json_object(), *pieces = json_array();
        char crc[9];
        snprintf(crc, sizeof crc, "%08" PRIx32, mf->crc32c);
        if (!o || !pieces || json_array_append_new(files, o) != 0) {
            json_decref(pieces);
            json_decref(files);
            return NULL;
        }
        json_object_set_new(o, "name", json_string(mf->name));
        json_object_set_new(o, "rank", json_integer(mf->rank));
        json_object_set_new(o, "bytes", json_integer((json_int_t)mf->bytes));
        json_object_set_new(o, "crc32c", json_string(crc));
        json_object_set_new(o, "pieces", pieces);
        for (int i = 0; i < mf->npieces; i++) {
            const mf_ckpt_mpiece *p = &m->pieces[mf->first + i];
            json_array_append_new(pieces, json_pack("[iiIII]", p->state, p->tensor, (json_int_t)p->start,
                                                    (json_int_t)p->end, (json_int_t)p->offset));
        }
        if (mf->blob_bytes)
            json_object_set_new(o, "user_blob", json_pack("[II]", (json_int_t)mf->blob_offset,
                                                          (json_int_t)mf->blob_bytes));
    }
    return files;
}

char *mf_ckpt_manifest_dump(const mf_ckpt_manifest *m)
{
    json_t *root = json_object(), *mesh = json_array(), *states = json_array(), *tensors = json_array();
    char *text = NULL;
    if (!root || !mesh || !states || !tensors)
        goto done;
    json_object_set_new(root, "format", json_string(MF_CKPT_FORMAT));
    json_object_set_new(root, "version", json_integer(m->version));
    json_object_set_new(root, "checkpoint_id", json_string(m->id));
    json_object_set_new(root, "step", json_integer(m->step));
    json_object_set_new(root, "schedule_sha256", json_string(m->schedule_sha256));
    for (int a = 0; a < m->naxes; a++)
        json_array_append_new(mesh, json_pack("{sssI}", "axis", m->axis_name[a], "size",
                                              (json_int_t)m->axis_size[a]));
    json_object_set(root, "mesh", mesh);
    json_object_set_new(root, "world", json_integer(m->world));
    for (int i = 0; i < m->nstates; i++)
        json_array_append_new(states, json_pack("{ssss}", "name", m->states[i].name, "dtype",
                                                mf_dtype_name(m->states[i].dtype)));
    json_object_set(root, "states", states);
    for (int i = 0; i < m->ntensors; i++) {
        json_t *shape = json_array();
        for (int d = 0; shape && d < m->tensors[i].ndims; d++)
            json_array_append_new(shape, json_integer(m->tensors[i].dims[d]));
        json_array_append_new(tensors, json_pack("{ssso}", "name", m->tensors[i].name, "shape", shape));
    }
    json_object_set(root, "tensors", tensors);
    json_t *files = mf_mf_files_json(m);
    if (!files)
        goto done;
    json_object_set_new(root, "files", files);
    text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
done:
    json_decref(mesh);
    json_decref(states);
    json_decref(tensors);
    json_decref(root);
    return text;
}

/* ---- parse ---- */

typedef struct mf_mf_ctx {
    const char *fname;
    char *err;
    size_t errlen;
} mf_mf_ctx;

static int64_t mf_mf_int(const json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
}

static int mf_mf_head(mf_mf_ctx *c, json_t *root, mf_ckpt_manifest *m)
{
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, MF_CKPT_FORMAT) != 0)
        return mf_mf_err(c->err, c->errlen, "%s: \"format\" is not \"%s\"", c->fname, MF_CKPT_FORMAT);
    m->version = (int)mf_mf_int(json_object_get(root, "version"));
    if (m->version != MF_CKPT_VERSION)
        return mf_mf_err(c->err, c->errlen, "%s: format version %d is not supported (this library reads %d)",
                         c->fname, m->version, MF_CKPT_VERSION);
    const char *id = json_string_value(json_object_get(root, "checkpoint_id"));
    const char *sha = json_string_value(json_object_get(root, "schedule_sha256"));
    if (!id || strlen(id) != 32 || strspn(id, "0123456789abcdef") != 32)
        return mf_mf_err(c->err, c->errlen, "%s: \"checkpoint_id\" is not 32 hex digits", c->fname);
    if (!sha || strlen(sha) != 64)
        return mf_mf_err(c->err, c->errlen, "%s: \"schedule_sha256\" is not 64 hex digits", c->fname);
    memcpy(m->id, id, 33);
    memcpy(m->schedule_sha256, sha, 65);
    m->step = mf_mf_int(json_object_get(root, "step"));
    m->world = mf_mf_int(json_object_get(root, "world"));
    if (m->step < 0 || m->world < 1)
        return mf_mf_err(c->err, c->errlen, "%s: \"step\" or \"world\" is missing or negative", c->fname);
    json_t *mesh = json_object_get(root, "mesh");
    if (!json_is_array(mesh) || json_array_size(mesh) < 1 || json_array_size(mesh) > MF_MAX_AXES)
        return mf_mf_err(c->err, c->errlen, "%s: \"mesh\" must list 1 to %d axes", c->fname, MF_MAX_AXES);
    int64_t world = 1;
    for (size_t a = 0; a < json_array_size(mesh); a++) {
        json_t *ax = json_array_get(mesh, a);
        const char *n = json_string_value(json_object_get(ax, "axis"));
        int64_t sz = mf_mf_int(json_object_get(ax, "size"));
        if (!n || sz < 1 || sz > (1 << 24))
            return mf_mf_err(c->err, c->errlen, "%s: mesh[%zu]: needs \"axis\" and a \"size\" >= 1", c->fname, a);
        m->axis_name[m->naxes] = strdup(n);
        m->axis_size[m->naxes++] = sz;
        if (!m->axis_name[m->naxes - 1])
            return mf_mf_err(c->err, c->errlen, "%s: out of memory", c->fname);
        world *= sz;
    }
    if (world != m->world)
        return mf_mf_err(c->err, c->errlen, "%s: \"world\" %lld is not the mesh's %lld ranks", c->fname,
                         (long long)m->world, (long long)world);
    return 0;
}

static int mf_mf_states_tensors(mf_mf_ctx *c, json_t *root, mf_ckpt_manifest *m)
{
    json_t *st = json_object_get(root, "states"), *ts = json_object_get(root, "tensors");
    if (!json_is_array(st) || json_array_size(st) < 1 || json_array_size(st) > 64)
        return mf_mf_err(c->err, c->errlen, "%s: \"states\" must list 1 to 64 states", c->fname);
    if (!json_is_array(ts) || json_array_size(ts) > (1u << 24))
        return mf_mf_err(c->err, c->errlen, "%s: \"tensors\" is not an array", c->fname);
    m->states = calloc(json_array_size(st), sizeof *m->states);
    m->tensors = calloc(json_array_size(ts) + 1, sizeof *m->tensors);
    if (!m->states || !m->tensors)
        return mf_mf_err(c->err, c->errlen, "%s: out of memory", c->fname);
    for (size_t i = 0; i < json_array_size(st); i++) {
        json_t *o = json_array_get(st, i);
        const char *n = json_string_value(json_object_get(o, "name"));
        int d = mf_dtype_from_name(json_string_value(json_object_get(o, "dtype")));
        if (!n || !mf_ckpt_manifest_state_name_ok(n) || d < 0)
            return mf_mf_err(c->err, c->errlen, "%s: states[%zu]: needs a \"name\" ([A-Za-z0-9_.-]) and a "
                             "\"dtype\" (fp32, bf16, fp16)", c->fname, i);
        if (mf_ckpt_manifest_state(m, n) >= 0 || (i == 0) != (strcmp(n, "main_weight") == 0))
            return mf_mf_err(c->err, c->errlen, "%s: states[%zu]: \"%s\" is a duplicate, or main_weight is "
                             "not states[0]", c->fname, i, n);
        m->states[i].dtype = (mf_dtype)d;
        m->states[i].name = strdup(n);
        m->nstates++;
        if (!m->states[i].name)
            return mf_mf_err(c->err, c->errlen, "%s: out of memory", c->fname);
    }
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *o = json_array_get(ts, i), *shape = json_object_get(o, "shape");
        const char *n = json_string_value(json_object_get(o, "name"));
        if (!n || !json_is_array(shape) || json_array_size(shape) > MF_MAX_DIMS)
            return mf_mf_err(c->err, c->errlen, "%s: tensors[%zu]: needs a \"name\" and a \"shape\" of at most "
                             "%d sizes", c->fname, i, MF_MAX_DIMS);
        if (mf_ckpt_manifest_tensor(m, n) >= 0)
            return mf_mf_err(c->err, c->errlen, "%s: tensors[%zu]: duplicate tensor \"%s\"", c->fname, i, n);
        mf_ckpt_mtensor *t = &m->tensors[i];
        t->ndims = (int)json_array_size(shape);
        t->numel = 1;
        for (int d = 0; d < t->ndims; d++) {
            t->dims[d] = mf_mf_int(json_array_get(shape, (size_t)d));
            if (t->dims[d] < 0 || (t->dims[d] && t->numel > (INT64_MAX / 16) / t->dims[d]))
                return mf_mf_err(c->err, c->errlen, "%s: tensors[%zu] (\"%s\"): shape[%d] is not a size",
                                 c->fname, i, n, d);
            t->numel *= t->dims[d];
        }
        t->name = strdup(n);
        m->ntensors++;
        if (!t->name)
            return mf_mf_err(c->err, c->errlen, "%s: out of memory", c->fname);
    }
    return 0;
}

static int mf_mf_file(mf_mf_ctx *c, json_t *o, int f, mf_ckpt_manifest *m)
{
    mf_ckpt_mfile *mf = &m->files[f];
    const char *n = json_string_value(json_object_get(o, "name"));
    const char *crc = json_string_value(json_object_get(o, "crc32c"));
    json_t *pieces = json_object_get(o, "pieces"), *blob = json_object_get(o, "user_blob");
    int64_t bytes = mf_mf_int(json_object_get(o, "bytes")), rank = mf_mf_int(json_object_get(o, "rank"));
    if (!n || !mf_mf_file_name_ok(n) || strcmp(n, MF_CKPT_MANIFEST) == 0)
        return mf_mf_err(c->err, c->errlen, "%s: files[%d]: \"name\" must be a plain file name", c->fname, f);
    for (int g = 0; g < f; g++)
        if (strcmp(m->files[g].name, n) == 0)
            return mf_mf_err(c->err, c->errlen, "%s: files[%d]: duplicate file \"%s\"", c->fname, f, n);
    if (!crc || strlen(crc) != 8 || strspn(crc, "0123456789abcdef") != 8 || bytes < 8 || rank < 0 ||
        rank >= m->world || !json_is_array(pieces))
        return mf_mf_err(c->err, c->errlen, "%s: files[%d] (\"%s\"): needs \"rank\" in the world, \"bytes\", "
                         "\"crc32c\" (8 hex digits) and \"pieces\"", c->fname, f, n);
    mf->name = strdup(n);
    if (!mf->name)
        return mf_mf_err(c->err, c->errlen, "%s: out of memory", c->fname);
    mf->rank = rank;
    mf->bytes = (uint64_t)bytes;
    mf->crc32c = (uint32_t)strtoul(crc, NULL, 16);
    mf->first = (int)m->npieces;
    for (size_t i = 0; i < json_array_size(pieces); i++) {
        json_t *p = json_array_get(pieces, i);
        mf_ckpt_mpiece *mp = &m->pieces[m->npieces];
        int64_t v[5];
        for (int k = 0; k < 5; k++)
            v[k] = json_is_array(p) && json_array_size(p) == 5 ? mf_mf_int(json_array_get(p, (size_t)k)) : -1;
        if (v[0] < 0 || v[0] >= m->nstates || v[1] < 0 || v[1] >= m->ntensors || v[2] < 0 ||
            v[3] <= v[2] || v[3] > m->tensors[v[1]].numel || v[4] < 8)
            return mf_mf_err(c->err, c->errlen, "%s: files[%d].pieces[%zu]: not [state, tensor, start, end, "
                             "offset] with 0 <= start < end <= numel", c->fname, f, i);
        *mp = (mf_ckpt_mpiece){(int)v[0], (int)v[1], f, v[2], v[3], (uint64_t)v[4]};
        uint64_t len = (uint64_t)(v[3] - v[2]) * mf_dtype_size(m->states[v[0]].dtype);
        if (mp->offset > mf->bytes || len > mf->bytes - mp->offset)
            return mf_mf_err(c->err, c->errlen, "%s: files[%d].pieces[%zu]: bytes [%llu, %llu) run past the "
                             "file's %llu bytes", c->fname, f, i, (unsigned long long)mp->offset,
                             (unsigned long long)(mp->offset + len), (unsigned long long)mf->bytes);
        m->npieces++;
        mf->npieces++;
    }
    if (blob) {
        int64_t bo = json_array_size(blob) == 2 ? mf_mf_int(json_array_get(blob, 0)) : -1;
        int64_t bn = json_array_size(blob) == 2 ? mf_mf_int(json_array_get(blob, 1)) : -1;
        if (bo < 8 || bn < 1 || (uint64_t)bo > mf->bytes || (uint64_t)bn > mf->bytes - (uint64_t)bo)
            return mf_mf_err(c->err, c->errlen, "%s: files[%d].user_blob: not [offset, bytes] inside the file",
                             c->fname, f);
        mf->blob_offset = (uint64_t)bo;
        mf->blob_bytes = (uint64_t)bn;
    }
    return 0;
}

static int mf_mf_piece_cmp(const void *a, const void *b, void *ctx)
{
    const mf_ckpt_manifest *m = ctx;
    const mf_ckpt_mpiece *x = &m->pieces[*(const int64_t *)a];
    const mf_ckpt_mpiece *y = &m->pieces[*(const int64_t *)b];
    return mf_cmp_keys((const int64_t[]){x->state, x->tensor, x->start},
                       (const int64_t[]){y->state, y->tensor, y->start}, 3);
}

/* Every (state, tensor) is tiled exactly by its pieces. */
static int mf_mf_coverage(mf_mf_ctx *c, mf_ckpt_manifest *m)
{
    m->by_tensor = malloc((size_t)(m->npieces + 1) * sizeof *m->by_tensor);
    if (!m->by_tensor)
        return mf_mf_err(c->err, c->errlen, "%s: out of memory", c->fname);
    for (int64_t i = 0; i < m->npieces; i++)
        m->by_tensor[i] = i;
    qsort_r(m->by_tensor, (size_t)m->npieces, sizeof *m->by_tensor, mf_mf_piece_cmp, m);
    int64_t i = 0;
    for (int s = 0; s < m->nstates; s++)
        for (int t = 0; t < m->ntensors; t++) {
            int64_t at = 0;
            const char *tn = m->tensors[t].name, *sn = m->states[s].name, *prev = NULL; /* file of the last piece */
            for (; i < m->npieces && m->pieces[m->by_tensor[i]].state == s &&
                   m->pieces[m->by_tensor[i]].tensor == t; i++) {
                const mf_ckpt_mpiece *p = &m->pieces[m->by_tensor[i]];
                const char *file = m->files[p->file].name;
                if (p->start < at)
                    return mf_mf_err(c->err, c->errlen, "%s: %s of tensor \"%s\": elements [%lld, %lld) are stored "
                                     "twice (in file \"%s\" and in file \"%s\")", c->fname, sn, tn,
                                     (long long)p->start, (long long)at, prev, file);
                if (p->start > at && prev)
                    return mf_mf_err(c->err, c->errlen, "%s: %s of tensor \"%s\": elements [%lld, %lld) are stored "
                                     "nowhere (the piece before them ends at %lld in file \"%s\", the next starts "
                                     "at %lld in file \"%s\")", c->fname, sn, tn, (long long)at,
                                     (long long)p->start, (long long)at, prev, (long long)p->start, file);
                if (p->start > at)
                    return mf_mf_err(c->err, c->errlen, "%s: %s of tensor \"%s\": elements [%lld, %lld) are stored "
                                     "nowhere (the first piece starts at %lld, in file \"%s\")", c->fname, sn, tn,
                                     (long long)at, (long long)p->start, (long long)p->start, file);
                at = p->end;
                prev = file;
            }
            if (at != m->tensors[t].numel && prev)
                return mf_mf_err(c->err, c->errlen, "%s: %s of tensor \"%s\": elements [%lld, %lld) are stored "
                                 "nowhere (the last piece ends at %lld, in file \"%s\")", c->fname, sn, tn,
                                 (long long)at, (long long)m->tensors[t].numel, (long long)at, prev);
            if (at != m->tensors[t].numel)
                return mf_mf_err(c->err, c->errlen, "%s: %s of tensor \"%s\": elements [%lld, %lld) are stored "
                                 "nowhere (no piece)", c->fname, sn, tn, (long long)at,
                                 (long long)m->tensors[t].numel);
        }
    return 0;
}

int mf_ckpt_manifest_parse(const char *fname, const char *text, size_t len, mf_ckpt_manifest *out, char *err,
                           size_t errlen)
{
    memset(out, 0, sizeof *out);
    mf_mf_ctx c = {fname, err, errlen};
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return mf_mf_err(err, errlen, "%s: line %d, column %d: %s", fname, je.line, je.column, je.text);
    int rc = -1;
    if (!json_is_object(root)) {
        mf_diag_errf(err, errlen, "%s: not a JSON object", fname);
        goto done;
    }
    if (mf_mf_head(&c, root, out) != 0 || mf_mf_states_tensors(&c, root, out) != 0)
        goto done;
    json_t *files = json_object_get(root, "files");
    if (!json_is_array(files) || json_array_size(files) > (1u << 24)) {
        mf_diag_errf(err, errlen, "%s: \"files\" is not an array", fname);
        goto done;
    }
    size_t np = 0;
    for (size_t f = 0; f < json_array_size(files); f++)
        np += json_array_size(json_object_get(json_array_get(files, f), "pieces"));
    out->files = calloc(json_array_size(files) + 1, sizeof *out->files);
    out->pieces = calloc(np + 1, sizeof *out->pieces);
    if (!out->files || !out->pieces) {
        mf_diag_errf(err, errlen, "%s: out of memory", fname);
        goto done;
    }
    for (size_t f = 0; f < json_array_size(files); f++) {
        out->nfiles++;
        if (mf_mf_file(&c, json_array_get(files, f), (int)f, out) != 0)
            goto done;
    }
    rc = mf_mf_coverage(&c, out);
done:
    json_decref(root);
    if (rc != 0)
        mf_ckpt_manifest_free(out);
    return rc;
}
