/*
 * mf_rt_schedule: the schedule handle (mf_rt_schedule.h). Loads a schedule
 * file or buffer, runs the verifier on it (MFSDP_VERIFY=0: only the loader's
 * checks), wraps it with its tensor table (schedule order, each tensor's
 * unit), and answers the public schedule queries.
 *
 * Ownership: a handle owns its mf_schedule; mfsdp_schedule_free releases
 * both. A failed load leaves nothing allocated and its message in the
 * thread's last error.
 */
#include "mf_rt_schedule.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_base.h"
#include "mf_load.h"
#include "mf_struct.h"
#include "mf_verify.h"

/* ---- a spec loaded as a schedule ---- */

/* True when text starts (after blank and '#' comment lines) with a
 * statement keyword of the .mfsdp language followed by anything but ':'
 * (a YAML schedule starts with "format: ..."). */
static bool looks_like_spec(const char *text, size_t len)
{
    static const char *const kw[] = {"mesh", "microbatches", "reduce", "align", "prefetch",
                                     "bucket_size", "layout", "unit"};
    size_t i = 0;
    for (;;) {
        while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n'))
            i++;
        if (i < len && text[i] == '#') {
            while (i < len && text[i] != '\n')
                i++;
            continue;
        }
        break;
    }
    for (size_t k = 0; k < sizeof kw / sizeof kw[0]; k++) {
        size_t n = strlen(kw[k]);
        if (len - i > n && strncmp(text + i, kw[k], n) == 0 &&
            (text[i + n] == ' ' || text[i + n] == '\t' || text[i + n] == '"')) {
            size_t j = i + n;
            while (j < len && (text[j] == ' ' || text[j] == '\t'))
                j++;
            return j < len && text[j] != ':';
        }
    }
    return false;
}

/* When a failed load's input is a .mfsdp spec, replaces err with "this is a
 * spec; compile it with `mfsdpc compile`" (the original message kept at its
 * end); otherwise leaves err alone. */
static void spec_hint(const char *name, const void *text, size_t len, char *err, size_t errlen)
{
    if (!text || !looks_like_spec(text, len))
        return;
    char was[MF_RT_ERRLEN];
    snprintf(was, sizeof was, "%s", err);
    snprintf(err, errlen,
             "%s: this is a .mfsdp spec, not a compiled schedule; compile it with "
             "`mfsdpc compile %s -o schedule.yaml` and load the YAML (the schedule loader said: "
             "%.600s)",
             name, name, was);
}

static void spec_hint_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return;
    char head[4096];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    spec_hint(path, head, n, err, errlen);
}

/* ---- the handle ---- */

/* Longest unit name in [first, last] that prefixes `name` followed by '.'. */
static int tensor_unit(const mf_schedule *s, const mf_bucket *b, const char *name)
{
    if (b->last_unit <= b->unit)
        return b->unit;
    int best = b->unit;
    size_t best_len = 0;
    for (int u = b->unit; u <= b->last_unit && u < s->nunits; u++) {
        size_t n = strlen(s->units[u].name);
        if (n > best_len && strncmp(name, s->units[u].name, n) == 0 && name[n] == '.') {
            best = u;
            best_len = n;
        }
    }
    return best;
}

mfsdp_result mf_rt_schedule_wrap(mf_schedule *s, mfsdp_schedule **out, char *err, size_t errlen)
{
    *out = NULL;
    /* The loader ran these rules already; a schedule built in memory has not. */
    if (!mf_struct_check_first(s, err, errlen)) {
        mf_schedule_free(s);
        return MFSDP_ERR_LOAD;
    }
    mfsdp_schedule *h = mf_base_calloc(1, sizeof *h);
    int nt = 0;
    for (int b = 0; b < s->nbuckets; b++)
        nt += s->buckets[b].ntensors;
    mf_rt_tensor *t = mf_arena_array(s->arena, (size_t)(nt ? nt : 1), sizeof *t);
    if (!h || !t) {
        mf_base_free(h);
        mf_schedule_free(s);
        snprintf(err, errlen, "out of memory");
        return MFSDP_ERR_OUT_OF_MEMORY;
    }
    int k = 0;
    for (int b = 0; b < s->nbuckets; b++)
        for (int i = 0; i < s->buckets[b].ntensors; i++, k++) {
            t[k].bucket = b;
            t[k].index = i;
            t[k].unit = tensor_unit(s, &s->buckets[b], s->buckets[b].tensors[i].name);
        }
    h->s = s;
    h->ntensors = nt;
    h->tensors = t;
    *out = h;
    return MFSDP_OK;
}

/*
 * Verify on load (docs/runtime.md §2): the verifier's structure, replay and
 * memory checks (core/mf_verify.c) on every schedule a trainer loads, so a
 * hand-edited or damaged schedule is refused with the verifier's located
 * message instead of replaying wrong. MFSDP_VERIFY=0 in the environment skips
 * it for a trusted schedule (the loader's own checks still run). Takes s on
 * failure.
 */
static bool verify_loaded(mf_schedule *s, const char *file, char *err, size_t errlen)
{
    const char *env = getenv("MFSDP_VERIFY");
    if (env && strcmp(env, "0") == 0)
        return true;
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) {
        snprintf(err, errlen, "%s: out of memory (verifying the schedule)", file);
        mf_schedule_free(s);
        return false;
    }
    /* Messages name the file loaded, never the spec its source: key names
     * (which may not exist here, or may differ from what was compiled). */
    mf_source src = {file, NULL, 0};
    mf_diag d;
    mf_diag_init(&d, &src, mem);
    d.max_errors = 1;
    int n = mf_verify_run(s, &d);
    fclose(mem);
    if (n > 0) {
        size_t first = text ? strcspn(text, "\n") : 0;
        snprintf(err, errlen, "%.*s (the verifier found %d error%s in this schedule; compile its spec again with "
                 "mfsdpc compile SPEC -o %.200s)",
                 (int)(first < 700 ? first : 700), text ? text : "", n, n == 1 ? "" : "s", file);
        mf_schedule_free(s);
    }
    free(text);
    return n == 0;
}

MFSDP_API mfsdp_result mfsdp_schedule_load(const char *path, mfsdp_schedule **out)
{
    if (!path || !out)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_schedule_load: path and out must not be NULL");
    *out = NULL;
    char *err = mf_base_thread_error();
    mf_schedule *s = mf_load_schedule_file(path, err, MF_RT_ERRLEN);
    if (!s) {
        spec_hint_file(path, err, MF_RT_ERRLEN);
        return MFSDP_ERR_LOAD;
    }
    if (!verify_loaded(s, path, err, MF_RT_ERRLEN))
        return MFSDP_ERR_LOAD;
    return mf_rt_schedule_wrap(s, out, err, MF_RT_ERRLEN);
}

MFSDP_API mfsdp_result mfsdp_schedule_load_buffer(const char *name, const void *text, size_t len,
                                                  mfsdp_schedule **out)
{
    if (!text || !out)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_schedule_load_buffer: text and out must not be NULL");
    *out = NULL;
    char *err = mf_base_thread_error();
    mf_schedule *s = mf_load_schedule_buffer(name ? name : "<buffer>", text, len, err, MF_RT_ERRLEN);
    if (!s) {
        spec_hint(name ? name : "<buffer>", text, len, err, MF_RT_ERRLEN);
        return MFSDP_ERR_LOAD;
    }
    if (!verify_loaded(s, name ? name : "<buffer>", err, MF_RT_ERRLEN))
        return MFSDP_ERR_LOAD;
    return mf_rt_schedule_wrap(s, out, err, MF_RT_ERRLEN);
}

MFSDP_API void mfsdp_schedule_free(mfsdp_schedule *h)
{
    if (!h)
        return;
    mf_schedule_free(h->s);
    mf_base_free(h);
}

MFSDP_API int64_t mfsdp_schedule_world_size(const mfsdp_schedule *h)
{
    return h ? h->s->mesh.world : 0;
}

MFSDP_API int mfsdp_schedule_num_axes(const mfsdp_schedule *h)
{
    return h ? h->s->mesh.naxes : 0;
}

MFSDP_API const char *mfsdp_schedule_axis_name(const mfsdp_schedule *h, int axis)
{
    return h && axis >= 0 && axis < h->s->mesh.naxes ? h->s->mesh.axes[axis].name : NULL;
}

MFSDP_API int64_t mfsdp_schedule_peak_bytes(const mfsdp_schedule *h)
{
    return h ? h->s->mem_persistent + h->s->mem_transient : 0;
}

MFSDP_API int64_t mfsdp_schedule_axis_size(const mfsdp_schedule *h, int axis)
{
    return h && axis >= 0 && axis < h->s->mesh.naxes ? h->s->mesh.axes[axis].size : 0;
}

MFSDP_API int64_t mfsdp_schedule_microbatches(const mfsdp_schedule *h)
{
    return h ? h->s->microbatches : 0;
}

MFSDP_API int mfsdp_schedule_num_units(const mfsdp_schedule *h)
{
    return h ? h->s->nunits : 0;
}

MFSDP_API const char *mfsdp_schedule_unit_name(const mfsdp_schedule *h, int unit)
{
    return h && unit >= 0 && unit < h->s->nunits ? h->s->units[unit].name : NULL;
}

MFSDP_API int mfsdp_schedule_reduce_is_avg(const mfsdp_schedule *h)
{
    return h && h->s->reduce == MF_REDUCE_AVG;
}

MFSDP_API void mfsdp_schedule_hash(const mfsdp_schedule *h, uint8_t out[32])
{
    if (h && out)
        memcpy(out, h->s->hash, 32);
}

MFSDP_API int mfsdp_schedule_num_tensors(const mfsdp_schedule *h)
{
    return h ? h->ntensors : 0;
}

void mf_rt_schedule_tensor_id(const mfsdp_schedule *h, int k, const char **name, int *unit, int *ndims,
                              int64_t dims[MFSDP_MAX_DIMS], int64_t *numel)
{
    const mf_rt_tensor *rt_t = &h->tensors[k];
    const mf_tensor *t = &h->s->buckets[rt_t->bucket].tensors[rt_t->index];
    *name = t->name;
    *unit = rt_t->unit;
    *ndims = t->ndims;
    for (int d = 0; d < t->ndims && d < MFSDP_MAX_DIMS; d++)
        dims[d] = t->dims[d];
    *numel = t->numel;
}

MFSDP_API mfsdp_result mfsdp_schedule_tensor_info(const mfsdp_schedule *h, int index,
                                                  mfsdp_tensor_info *out)
{
    if (!h || !out || index < 0 || index >= h->ntensors)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_schedule_tensor_info: index %d out of range [0, %d)", index,
                               h ? h->ntensors : 0);
    const mf_bucket *bk = &h->s->buckets[h->tensors[index].bucket];
    memset(out, 0, sizeof *out);
    mf_rt_schedule_tensor_id(h, index, &out->name, &out->unit, &out->ndims, out->dims, &out->numel);
    out->weight_dtype = (mfsdp_dtype)bk->dtype[MF_ROLE_WEIGHT];
    out->grad_dtype = (mfsdp_dtype)bk->dtype[MF_ROLE_GRAD];
    out->main_weight_dtype = (mfsdp_dtype)bk->dtype[MF_ROLE_MAIN_WEIGHT];
    return MFSDP_OK;
}

MFSDP_API int mfsdp_schedule_tensor_whole(const mfsdp_schedule *h, int index)
{
    if (!h || index < 0 || index >= h->ntensors)
        return 0;
    const mf_bucket *bk = &h->s->buckets[h->tensors[index].bucket];
    return (bk->whole[MF_ROLE_GRAD] ? MFSDP_WHOLE_GRAD : 0) |
           (bk->whole[MF_ROLE_MAIN_WEIGHT] ? MFSDP_WHOLE_MAIN_WEIGHT : 0);
}

