/*
 * mf_persist: see the header. Linear in buffers per rank.
 */
#include "mf_persist.h"

#include "mf_layout.h"
#include "mf_live.h"

static int64_t aligned(const mf_schedule *s, int64_t bytes)
{
    int64_t a = s->align > 0 ? s->align : 1;
    return (bytes + a - 1) / a * a;
}

static const mf_bucket *bucket_of(const mf_schedule *s, int b)
{
    int k = s->buffers[b].bucket;
    return k >= 0 && k < s->nbuckets ? &s->buckets[k] : NULL;
}

bool mf_persist_per_rank(const mf_schedule *s, int b)
{
    const mf_bucket *bk = bucket_of(s, b);
    return bk && bk->bounds && !mf_live_in_arena(&s->buffers[b]);
}

int64_t mf_persist_held(const mf_schedule *s, int b, int64_t rank)
{
    const mf_bucket *bk = bucket_of(s, b);
    const mf_buffer *bf = &s->buffers[b];
    if (!bk || !bk->bounds)
        return bf->count;
    return mf_layout_bucket_range(&s->mesh, bk, &bf->place, rank).len;
}

int64_t mf_persist_shared_end(const mf_schedule *s)
{
    int64_t end = 0;
    for (int b = 0; b < s->nbuffers; b++)
        if (!mf_live_in_arena(&s->buffers[b]) && !mf_persist_per_rank(s, b)) {
            int64_t e = s->buffers[b].offset + mf_live_bytes(s, b);
            end = e > end ? e : end;
        }
    return aligned(s, end);
}

int64_t mf_persist_layout(const mf_schedule *s, int64_t rank, int64_t *offsets)
{
    int64_t at = mf_persist_shared_end(s);
    for (int b = 0; b < s->nbuffers; b++) {
        if (mf_live_in_arena(&s->buffers[b]))
            continue;
        if (!mf_persist_per_rank(s, b)) {
            if (offsets)
                offsets[b] = s->buffers[b].offset;
            continue;
        }
        if (offsets)
            offsets[b] = at;
        at += aligned(s, mf_persist_held(s, b, rank) * (int64_t)mf_dtype_size(s->buffers[b].dtype));
    }
    return at;
}

int64_t mf_persist_at(const mf_schedule *s, int b, int64_t rank)
{
    if (!mf_persist_per_rank(s, b))
        return s->buffers[b].offset;
    int64_t at = mf_persist_shared_end(s);
    for (int i = 0; i < b; i++)
        if (mf_persist_per_rank(s, i))
            at += aligned(s, mf_persist_held(s, i, rank) * (int64_t)mf_dtype_size(s->buffers[i].dtype));
    return at;
}

void mf_persist_role_most(const mf_schedule *s, mf_lifetime life, int64_t out[MF_ROLE_COUNT])
{
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        out[r] = 0;
    int64_t world = mf_persist_any_per_rank(s) ? s->mesh.world : 1;
    for (int64_t rank = 0; rank < world; rank++) {
        int64_t sum[MF_ROLE_COUNT] = {0};
        for (int b = 0; b < s->nbuffers; b++)
            if (s->buffers[b].lifetime == life)
                sum[mf_bufkind_role(s->buffers[b].kind)] +=
                    mf_persist_held(s, b, rank) * (int64_t)mf_dtype_size(s->buffers[b].dtype);
        for (int r = 0; r < MF_ROLE_COUNT; r++)
            out[r] = sum[r] > out[r] ? sum[r] : out[r];
    }
}

bool mf_persist_any_per_rank(const mf_schedule *s)
{
    for (int b = 0; b < s->nbuffers; b++)
        if (mf_persist_per_rank(s, b))
            return true;
    return false;
}

int64_t mf_persist_most(const mf_schedule *s)
{
    int64_t world = mf_persist_any_per_rank(s) ? s->mesh.world : 1, most = 0;
    for (int64_t r = 0; r < world; r++) {
        int64_t n = mf_persist_layout(s, r, NULL);
        most = n > most ? n : most;
    }
    return most;
}
