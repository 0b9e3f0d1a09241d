/*
 * mf_ckpt_load: mfsdp_ckpt_load and mfsdp_ckpt_verify (mfsdp_ckpt.h). Every
 * rank opens the manifest, matches the checkpoint's tensors and states with
 * its runtime (all mismatches in one message), the ranks agree that every
 * rank passed, and only then does each rank pread the element ranges it
 * reads, straight into its buffers: the ranges it holds, or where the
 * backend lets replicas share (mf_ckpt_share.h) only its share of them. The
 * ranks agree that every read succeeded (so a refused checkpoint is refused
 * on every rank with the same message). Replicas receive what the others
 * read during the reads: with shared memory (local backend) the reader
 * copies each chunk into them, with message passing (MPI) it sends each
 * message as soon as it is read; either way every transfer is complete
 * before that last agreement round.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_agree.h"
#include "mf_abi.h"
#include "mf_ckpt_global.h"
#include "mf_ckpt_io.h"
#include "mf_ckpt_plan.h"
#include "mf_ckpt_share.h"
#include "mf_ckpt_stage.h"
#include "mf_diag.h"
#include "mf_hash.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

typedef struct mf_ckpt_lmsg {
    int64_t status;
    uint64_t states;        /* hash of the requested states (names, dtypes, order) */
    char msg[240];
} mf_ckpt_lmsg;

/* FNV-1a of the requested states' names and dtypes, in order: replicas
 * that share reads index each other's buffers by the state's position. */
static uint64_t mf_ckpt_states_hash(const mfsdp_ckpt_load_options *opt)
{
    uint64_t h = MF_FNV1A_BASIS ^ (uint64_t)opt->nstates;
    for (int i = 0; i < opt->nstates; i++) {
        const char *name = opt->states[i].name ? opt->states[i].name : "";
        int32_t dtype = (int32_t)opt->states[i].dtype;
        h = mf_hash_fnv1a(h, name, strlen(name) + 1); /* the NUL ends the name */
        h = mf_hash_fnv1a(h, &dtype, sizeof dtype);
    }
    return h;
}

/* Sharing ranks must ask for the same states: the same check, with the same
 * verdict, on every rank (all[] is the same everywhere). */
static mfsdp_result mf_ckpt_same_states(mf_rt *rt, const mf_ckpt_lmsg *all, const char *dir)
{
    for (int64_t r = 1; r < rt->world; r++)
        if (all[r].states != all[0].states)
            return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT, "checkpoint load of %s refused: rank %" PRId64
                                   " asks for other states than rank 0 (names, dtypes or order): replicas share "
                                   "their reads, so every rank must pass the same states", dir, r);
    return MFSDP_OK;
}

/* One round; a rank that failed itself reports its own full message
 * (`own`), the others the first failing rank's (truncated) one. */
static mfsdp_result mf_ckpt_lround(mf_rt *rt, const mf_ckpt_lmsg *mine, mf_ckpt_lmsg *all, const char *dir,
                                   const char *own)
{
    mfsdp_result res = rt->be->exchange(rt, mine, sizeof *mine, all);
    if (res != MFSDP_OK)
        return mf_base_set_error(rt, res, "checkpoint load: exchange between ranks failed: %s", mfsdp_last_error(rt));
    if (mine->status != MFSDP_OK)
        return mf_base_set_error(rt, (mfsdp_result)mine->status, "checkpoint load of %s refused: rank %" PRId64 ": %s",
                               dir, rt->rank, own);
    for (int64_t r = 0; r < rt->world; r++)
        if (all[r].status != MFSDP_OK)
            return mf_base_set_error(rt, (mfsdp_result)all[r].status, "checkpoint load of %s refused: rank %" PRId64
                                   ": %.*s", dir, r, (int)sizeof all[r].msg, all[r].msg);
    return MFSDP_OK;
}

static void mf_ckpt_lfail(mf_ckpt_lmsg *m, const char *text)
{
    m->status = MFSDP_ERR_LOAD;
    mf_diag_errf(m->msg, sizeof m->msg, "%s", text);   /* truncated to fit */
}

/* Appends one mismatch to err (keeps counting past the buffer). */
static void mf_ckpt_note(char *err, size_t errlen, int *count, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void mf_ckpt_note(char *err, size_t errlen, int *count, const char *fmt, ...)
{
    size_t at = strlen(err);
    va_list ap;
    va_start(ap, fmt);
    if (at + 4 < errlen) {
        if ((*count)++ > 0)
            at += (size_t)snprintf(err + at, errlen - at, "; ");
        if (at < errlen)
            vsnprintf(err + at, errlen - at, fmt, ap);
    }
    va_end(ap);
}

static void mf_ckpt_shape(const int64_t *d, int n, char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%" PRId64, i ? ", " : "", d[i]);
    if (at < size)
        snprintf(buf + at, size - at, "]");
}

/* Matches runtime and checkpoint; map[k] = checkpoint tensor of runtime
 * tensor k, smap[i] = checkpoint state of requested state i. */
static int mf_ckpt_match(mf_rt *rt, const mf_ckpt_manifest *m, const mfsdp_ckpt_load_options *opt, int *map,
                         int *smap, char *err, size_t errlen)
{
    int bad = 0;
    char a[160], b[160];
    err[0] = '\0';
    char serr[512]; /* first: a split tensor's axis of another size (its shape may agree) */
    if (mf_ckpt_plan_check_split(rt->s, m->naxes, m->axis_name, m->axis_size, serr, sizeof serr) != 0)
        mf_ckpt_note(err, errlen, &bad, "%s", serr);
    for (int k = 0; k < rt->nviews; k++) {
        const mfsdp_tensor_view *v = &rt->views[k];
        const char *gname = mf_ckpt_global_name(rt, k);
        int t = map[k] = mf_ckpt_manifest_tensor(m, gname);
        if (t < 0) {
            mf_ckpt_note(err, errlen, &bad, "tensor '%s' is not in the checkpoint", gname);
            continue;
        }
        int64_t run, grow, gbase, gdims[MF_MAX_DIMS]; /* the split form: the global W's dims */
        int split = mf_ckpt_global_map(rt, k, &run, &grow, &gbase, gdims);
        if (m->tensors[t].ndims != v->ndims ||
            memcmp(m->tensors[t].dims, gdims, sizeof(int64_t) * (size_t)v->ndims) != 0) {
            mf_ckpt_shape(m->tensors[t].dims, m->tensors[t].ndims, a, sizeof a);
            mf_ckpt_shape(gdims, v->ndims, b, sizeof b);
            if (split >= 0)
                mf_ckpt_note(err, errlen, &bad, "tensor '%s' (global '%s', split %d) has shape %s in the "
                             "checkpoint, %s in the schedule", v->name, gname, split, a, b);
            else
                mf_ckpt_note(err, errlen, &bad, "tensor '%s' has shape %s in the checkpoint, %s in the schedule",
                             v->name, a, b);
        }
        if ((int)v->main_weight_dtype != (int)m->states[0].dtype)
            mf_ckpt_note(err, errlen, &bad, "tensor '%s': main_weight is %s in the checkpoint, %s in the schedule",
                         v->name, mf_dtype_name(m->states[0].dtype), mfsdp_dtype_name(v->main_weight_dtype));
    }
    for (int t = 0; t < m->ntensors; t++)
        if (!mf_ckpt_global_known(rt, m->tensors[t].name))
            mf_ckpt_note(err, errlen, &bad, "checkpoint tensor '%s' is not in the schedule", m->tensors[t].name);
    for (int i = 0; i < opt->nstates; i++) {
        const mfsdp_ckpt_state *st = &opt->states[i];
        int s = smap[i] = st->name ? mf_ckpt_manifest_state(m, st->name) : -1;
        if (s <= 0)
            mf_ckpt_note(err, errlen, &bad, "state '%s' is not in the checkpoint", st->name ? st->name : "(null)");
        else if ((int)st->dtype != (int)m->states[s].dtype)
            mf_ckpt_note(err, errlen, &bad, "state '%s' is %s in the checkpoint, %s here", st->name,
                         mf_dtype_name(m->states[s].dtype), mfsdp_dtype_name(st->dtype));
        for (int k = 0; s > 0 && k < rt->nviews; k++)
            if (rt->views[k].shard_count > 0 && (!st->shards || !st->shards[k])) {
                mf_ckpt_note(err, errlen, &bad, "state '%s': no buffer for tensor '%s'", st->name,
                             rt->views[k].name);
                break;
            }
    }
    if (bad > 1) {
        char head[64];
        snprintf(head, sizeof head, "%d mismatches: ", bad);
        size_t hl = strlen(head), el = strlen(err);
        if (hl + el + 1 > errlen)
            el = errlen - hl - 1;
        memmove(err + hl, err, el);
        memcpy(err, head, hl);
        err[hl + el] = '\0';
    }
    return bad ? -1 : 0;
}

/* Reads the pieces this rank reads, hands the replicas theirs
 * (mf_ckpt_share.h), and reads the user blob. MFSDP_OK, MFSDP_ERR_LOAD (a
 * data error) or a backend's failure; the message in err. */
static mfsdp_result mf_ckpt_load_data(mf_rt *rt, mf_ckpt_lplan *lp, mf_ckpt_reader *r, mfsdp_ckpt_load_options *opt,
                                      const int *map, const int *smap, char *err, size_t errlen)
{
    mfsdp_result res = mf_ckpt_lplan_read(rt, lp, r, opt, map, smap, err, errlen);
    if (res != MFSDP_OK)
        return res;
    size_t len = 0;
    int64_t who = opt->user_blob_rank < 0 ? rt->rank : opt->user_blob_rank;
    if (mf_ckpt_read_blob(r, who, opt->user_blob, opt->user_blob_capacity, &len, err, errlen) != 0)
        return MFSDP_ERR_LOAD;
    opt->user_blob_bytes = len;
    return MFSDP_OK;
}

/* The CRC check of the pieces read in part (mf_ckpt_parts_check), over
 * every rank's parts: the ranks all-gather them (their counts first) and
 * each checks the pieces whose first part it read. Collective. A backend
 * without an all-gather (the GPU backends) checks its own parts, reading
 * the rest of each such piece itself. Returns MFSDP_OK, MFSDP_ERR_LOAD (a
 * piece fails, message in err) or a backend's failure (the runtime is
 * failed). */
static mfsdp_result mf_ckpt_load_parts(mf_rt *rt, mf_ckpt_reader *r, char *err, size_t errlen)
{
    for (int64_t i = 0; i < r->nparts; i++)
        r->parts[i].rank = rt->rank;
    if (!rt->be->allgather || rt->world == 1)
        return mf_ckpt_parts_check(r, r->parts, r->nparts, rt->rank, err, errlen) == 0 ? MFSDP_OK : MFSDP_ERR_LOAD;
    /* On a failed all-gather MPI may still write the buffers: they are
     * left allocated then (mf_backend.h). */
    int64_t mine = r->nparts, *counts = calloc((size_t)rt->world, sizeof *counts), most = 0;
    if (!counts)
        return snprintf(err, errlen, "out of memory"), MFSDP_ERR_OUT_OF_MEMORY;
    mfsdp_result res = rt->be->allgather(rt, &mine, sizeof mine, counts, err, errlen);
    if (res != MFSDP_OK)
        return mf_base_fail(rt, res, err), res;
    for (int64_t k = 0; k < rt->world; k++)
        most = counts[k] > most ? counts[k] : most;
    free(counts);
    if (most == 0)
        return MFSDP_OK;
    size_t per = (size_t)most * sizeof(mf_ckpt_part);
    mf_ckpt_part *own = calloc((size_t)most, sizeof *own), *all = calloc((size_t)most * (size_t)rt->world, sizeof *all);
    if (!own || !all) {
        free(own);
        free(all);
        return snprintf(err, errlen, "out of memory"), MFSDP_ERR_OUT_OF_MEMORY;
    }
    if (r->nparts > 0) /* this rank may have read no part (parts NULL) */
        memcpy(own, r->parts, (size_t)r->nparts * sizeof *own);
    for (int64_t i = r->nparts; i < most; i++)
        own[i].piece = -1; /* padding: no piece */
    res = rt->be->allgather(rt, own, per, all, err, errlen);
    if (res != MFSDP_OK)
        return mf_base_fail(rt, res, err), res;
    int64_t n = 0;
    for (int64_t i = 0; i < most * rt->world; i++)
        if (all[i].piece >= 0)
            all[n++] = all[i];
    res = mf_ckpt_parts_check(r, all, n, rt->rank, err, errlen) == 0 ? MFSDP_OK : MFSDP_ERR_LOAD;
    free(own);
    free(all);
    return res;
}

mfsdp_result mfsdp_ckpt_load(mfsdp_runtime *rt, const char *dir, mfsdp_ckpt_load_options *opt)
{
    if (!rt)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_ckpt_load: NULL runtime");
    mfsdp_result agreed = mf_base_handle_check(rt, "mfsdp_ckpt_load");
    if (agreed == MFSDP_OK)   /* every rank is at this call (docs/runtime.md §4.4) */
        agreed = mf_agree_helper(rt, "mfsdp_ckpt_load", 0);
    if (agreed == MFSDP_OK)
        agreed = mf_ckpt_global_check(rt, "mfsdp_ckpt_load");
    if (agreed != MFSDP_OK)
        return agreed;
    mf_ckpt_lmsg mine = {0}, *all = calloc((size_t)rt->world, sizeof *all);
    int *map = calloc((size_t)rt->nviews + 1, sizeof *map);
    int *smap = calloc(64, sizeof *smap);
    mf_ckpt_reader r;
    mf_ckpt_lplan lp = {0};
    int opened = 0;
    char err[2048] = "";
    mfsdp_result res = MFSDP_ERR_OUT_OF_MEMORY;
    if (!all || !map || !smap) {
        mf_base_set_error(rt, res, "out of memory");
        goto done;
    }
    mfsdp_result sr = MFSDP_OK;
    if (mf_ckpt_stage_active(rt) && (sr = mf_ckpt_stage_begin(rt, err, sizeof err)) != MFSDP_OK) {
        mf_ckpt_lfail(&mine, err);
        mine.status = sr;
    } else if (opt && MF_ABI_CHECK(mfsdp_ckpt_load_options, opt, mine.msg, sizeof mine.msg) != MFSDP_OK) {
        mine.status = MFSDP_ERR_INVALID_ARGUMENT;
    } else if (!dir || !opt || opt->nstates < 0 || opt->nstates > 63 || (opt->nstates && !opt->states)) {
        mine.status = MFSDP_ERR_INVALID_ARGUMENT;
        snprintf(mine.msg, sizeof mine.msg, "needs a directory and options (0..63 states)");
    } else if (mf_ckpt_lplan_build(rt, opt->nstates, &lp, err, sizeof err) != 0 ||
               mf_ckpt_read_open(dir, &r, err, sizeof err) != 0 || !(opened = 1) ||
               mf_ckpt_match(rt, &r.m, opt, map, smap, err, sizeof err) != 0) {
        mine.status = MFSDP_ERR_LOAD;
        mf_ckpt_lfail(&mine, err);
    } else if (opt->flags & MFSDP_CKPT_VERIFY_FILES) {
        for (int f = (int)rt->rank; f < r.m.nfiles && mine.status == MFSDP_OK; f += (int)rt->world)
            if (mf_ckpt_read_verify_file(&r, f, err, sizeof err) != 0) {
                mine.status = MFSDP_ERR_LOAD;
                mf_ckpt_lfail(&mine, err);
            }
    }
    if (mine.status == MFSDP_OK)
        mine.states = mf_ckpt_states_hash(opt);
    res = mf_ckpt_lround(rt, &mine, all, dir ? dir : "(null)", mine.status == MFSDP_ERR_LOAD ? err : mine.msg);
    if (res == MFSDP_OK && lp.share)
        res = mf_ckpt_same_states(rt, all, dir);
    if (res != MFSDP_OK)
        goto done;
    /* Shared memory: the replicas' buffer addresses; the reads then copy
     * into the replicas' buffers too (only now that every rank passed). */
    res = mf_ckpt_lplan_peers(rt, &lp, opt, err, sizeof err);
    if (res != MFSDP_OK) {
        mf_base_set_error(rt, res, "checkpoint load of %s: exchange between ranks failed: %s", dir, err);
        goto done;
    }
    memset(&mine, 0, sizeof mine);
    mfsdp_result dr = mf_ckpt_load_data(rt, &lp, &r, opt, map, smap, err, sizeof err);
    if (dr == MFSDP_OK || dr == MFSDP_ERR_LOAD) { /* collective: after a data error too */
        char perr[2048] = "";
        mfsdp_result pr = mf_ckpt_load_parts(rt, &r, perr, sizeof perr);
        if (dr == MFSDP_OK && pr != MFSDP_OK) {
            dr = pr;
            memcpy(err, perr, sizeof perr);
        }
    }
    if (dr != MFSDP_OK) {
        mf_ckpt_lfail(&mine, err);
        mine.status = dr;
    }
    opt->step = r.m.step;
    opt->bytes_read = r.bytes_read;
    res = mf_ckpt_lround(rt, &mine, all, dir, err);
done:
    if (opened)
        mf_ckpt_read_close(&r);
    mf_ckpt_lplan_free(&lp);
    free(all);
    free(map);
    free(smap);
    return res;
}

mfsdp_result mfsdp_ckpt_verify(const char *dir)
{
    mf_ckpt_reader r;
    char err[2048];
    if (!dir)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_ckpt_verify: NULL directory");
    if (mf_ckpt_read_open(dir, &r, err, sizeof err) != 0)
        return mf_base_set_error(NULL, MFSDP_ERR_LOAD, "%s", err);
    mfsdp_result res = MFSDP_OK;
    for (int f = 0; f < r.m.nfiles && res == MFSDP_OK; f++)
        if (mf_ckpt_read_verify_file(&r, f, err, sizeof err) != 0)
            res = mf_base_set_error(NULL, MFSDP_ERR_LOAD, "%s", err);
    mf_ckpt_read_close(&r);
    return res;
}
