/*
 * mf_layout: rank coordinates, axis groups and shard ranges (docs/semantics.md §2).
 */
#include "mf_layout.h"

void mf_layout_mesh_coords(const mf_mesh *m, int64_t rank, int64_t coords[MF_MAX_AXES])
{
    for (int j = m->naxes - 1; j >= 0; j--) {
        coords[j] = rank % m->axes[j].size;
        rank /= m->axes[j].size;
    }
    for (int j = m->naxes; j < MF_MAX_AXES; j++)
        coords[j] = 0;
}

int64_t mf_layout_mesh_rank(const mf_mesh *m, const int64_t coords[MF_MAX_AXES])
{
    int64_t r = 0;
    for (int j = 0; j < m->naxes; j++)
        r = r * m->axes[j].size + coords[j];
    return r;
}

void mf_layout_axis_group(const mf_mesh *m, int axis, int64_t rank, int64_t *out)
{
    int64_t c[MF_MAX_AXES];
    mf_layout_mesh_coords(m, rank, c);
    for (int64_t i = 0; i < m->axes[axis].size; i++) {
        c[axis] = i;
        out[i] = mf_layout_mesh_rank(m, c);
    }
}

int64_t mf_layout_axis_color(const mf_mesh *m, int axis, int64_t rank)
{
    int64_t c[MF_MAX_AXES];
    mf_layout_mesh_coords(m, rank, c);
    c[axis] = 0;
    int64_t color = 0;
    for (int j = 0; j < m->naxes; j++)
        if (j != axis)
            color = color * m->axes[j].size + c[j];
    return color;
}

int mf_layout_flat_start(const mf_placement *p, int naxes)
{
    int s = naxes;
    while (s > 0 && p->p[s - 1] == MF_PLACE_FLAT)
        s--;
    return s;
}

bool mf_layout_flat_suffix_ok(const mf_placement *p, int naxes)
{
    int s = mf_layout_flat_start(p, naxes);
    for (int j = 0; j < s; j++)
        if (p->p[j] == MF_PLACE_FLAT)
            return false;
    return true;
}

int64_t mf_layout_shards(const mf_mesh *m, const mf_placement *p)
{
    int64_t n = 1;
    for (int j = 0; j < m->naxes; j++)
        if (p->p[j] == MF_PLACE_FLAT)
            n *= m->axes[j].size;
    return n;
}

int64_t mf_layout_shard_index(const mf_mesh *m, const mf_placement *p,
                              const int64_t coords[MF_MAX_AXES])
{
    int s = mf_layout_flat_start(p, m->naxes);
    int64_t q = 0, stride = 1;
    for (int j = s; j < m->naxes; j++) {
        q += coords[j] * stride;
        stride *= m->axes[j].size;
    }
    return q;
}

mf_range mf_layout_range(const mf_mesh *m, const mf_placement *p, int64_t rank, int64_t L)
{
    int64_t c[MF_MAX_AXES];
    mf_layout_mesh_coords(m, rank, c);
    mf_range r;
    r.len = L / mf_layout_shards(m, p);
    r.offset = mf_layout_shard_index(m, p, c) * r.len;
    return r;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int64_t mf_layout_shard_quantum(const mf_dtype dt[MF_ROLE_COUNT], int64_t align)
{
    int64_t q = 1;
    if (align < 1)
        align = 1;
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        int64_t size = (int64_t)mf_dtype_size(dt[r]);
        if (size > 0) {
            int64_t x = align / gcd64(align, size);
            q = q / gcd64(q, x) * x;
        }
    }
    return q;
}

const mf_placement *mf_layout_bucket_fine(const mf_mesh *m, const mf_bucket *b)
{
    const mf_placement *best = NULL;
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (b->whole[r] && (!best || mf_layout_shards(m, &b->place[r]) > mf_layout_shards(m, best)))
            best = &b->place[r];
    return best;
}

int64_t mf_layout_bucket_nbounds(const mf_mesh *m, const mf_bucket *b)
{
    const mf_placement *fine = mf_layout_bucket_fine(m, b);
    return fine ? mf_layout_shards(m, fine) + 1 : 0;
}

bool mf_layout_bucket_placement_ok(const mf_mesh *m, const mf_bucket *b, const mf_placement *p)
{
    if (!b->bounds)
        return true;
    int64_t P = mf_layout_bucket_nbounds(m, b) - 1, n = mf_layout_shards(m, p);
    return P >= 1 && n <= P && P % n == 0;
}

mf_range mf_layout_bucket_shard(const mf_mesh *m, const mf_bucket *b, const mf_placement *p, int64_t q)
{
    mf_range r = {0, 0};
    int64_t n = mf_layout_shards(m, p);
    if (q < 0 || q >= n || !mf_layout_bucket_placement_ok(m, b, p))
        return r;
    if (!b->bounds) {
        r.len = b->length / n;
        r.offset = q * r.len;
        return r;
    }
    int64_t k = (mf_layout_bucket_nbounds(m, b) - 1) / n;
    r.offset = b->bounds[q * k];
    r.len = b->bounds[(q + 1) * k] - r.offset;
    return r;
}

mf_range mf_layout_bucket_range(const mf_mesh *m, const mf_bucket *b, const mf_placement *p, int64_t rank)
{
    int64_t c[MF_MAX_AXES];
    mf_layout_mesh_coords(m, rank, c);
    return mf_layout_bucket_shard(m, b, p, mf_layout_shard_index(m, p, c));
}

int64_t mf_layout_bucket_capacity(const mf_mesh *m, const mf_bucket *b, const mf_placement *p)
{
    int64_t n = mf_layout_shards(m, p), most = 0;
    if (!b->bounds)
        return b->length / n;
    for (int64_t q = 0; q < n; q++) {
        int64_t len = mf_layout_bucket_shard(m, b, p, q).len;
        most = len > most ? len : most;
    }
    return most;
}

int64_t mf_layout_tensor_shard(const mf_mesh *m, const mf_bucket *b, const mf_placement *p, int64_t offset,
                               int64_t numel)
{
    int64_t n = mf_layout_shards(m, p), L = b->length;
    if (offset < 0 || numel < 0 || offset > L - numel || !mf_layout_bucket_placement_ok(m, b, p))
        return -1;
    if (!b->bounds) {
        int64_t len = L / n;
        if (len <= 0)
            return -1;
        int64_t q = offset / len;
        if (numel > 0 && (offset + numel - 1) / len != q)
            return -1;
        return q < n ? q : -1;
    }
    for (int64_t q = 0; q < n; q++) {
        mf_range sh = mf_layout_bucket_shard(m, b, p, q);
        if (offset >= sh.offset && offset < sh.offset + sh.len)
            return offset + numel <= sh.offset + sh.len ? q : -1;
    }
    return -1;
}

int64_t mf_layout_shard_used(const mf_mesh *m, const mf_placement *p, const mf_bucket *b,
                             int64_t q)
{
    mf_range sh = mf_layout_bucket_shard(m, b, p, q);
    int64_t start = sh.offset, len = sh.len, used = 0;
    for (int i = 0; i < b->ntensors; i++) {
        const mf_tensor *t = &b->tensors[i];
        if (t->numel <= 0 || t->offset >= start + len || t->offset + t->numel <= start)
            continue;   /* does not overlap the shard */
        int64_t end = t->offset + t->numel - start;
        if (end > len)
            end = len;
        if (end > used)
            used = end;
    }
    return used;
}

bool mf_layout_bucket_whole(const mf_bucket *b)
{
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (b->whole[r])
            return true;
    return false;
}

const mf_placement *mf_layout_shard_side(mf_opkind k, const mf_placement *from, const mf_placement *to)
{
    return k == MF_OP_REDUCE_SCATTER ? to : from;
}

int64_t mf_layout_prefix_bytes(mf_opkind k, int64_t n, int64_t sum, int64_t own, mf_dtype d)
{
    if (n <= 1)
        return 0;
    if (k == MF_OP_ALL_REDUCE)
        return mf_schedule_collective_bytes(k, n, own, d);
    return (sum - own) * (int64_t)mf_dtype_size(d);
}

int64_t mf_layout_collective_bytes(const mf_mesh *m, const mf_bucket *b, mf_opkind k, int axis,
                                   const mf_placement *shard, int64_t count, mf_dtype d)
{
    if (axis < 0 || axis >= m->naxes)
        return 0;
    int64_t n = m->axes[axis].size, ring = mf_schedule_collective_bytes(k, n, count, d);
    if (ring == 0 || !b || !mf_layout_bucket_whole(b) || b->length <= 0 ||
        (!b->bounds && b->length % mf_layout_shards(m, shard) != 0) ||
        !mf_layout_bucket_placement_ok(m, b, shard))
        return ring;
    int64_t worst = 0;
    int64_t c[MF_MAX_AXES];
    for (int64_t r = 0; r < m->world; r++) {
        mf_layout_mesh_coords(m, r, c);
        if (k == MF_OP_ALL_REDUCE) {
            int64_t u = mf_layout_shard_used(m, shard, b, mf_layout_shard_index(m, shard, c));
            int64_t x = mf_layout_prefix_bytes(k, n, u, u, d);
            worst = x > worst ? x : worst;
            continue;
        }
        if (c[axis] != 0)
            continue; /* one pass per axis group: its members differ in c[axis] */
        int64_t sum = 0, least = INT64_MAX;
        for (int64_t i = 0; i < n; i++) {
            c[axis] = i;
            int64_t u = mf_layout_shard_used(m, shard, b, mf_layout_shard_index(m, shard, c));
            sum += u;
            least = u < least ? u : least;
        }
        /* the member with the smallest shard moves every other one */
        int64_t x = mf_layout_prefix_bytes(k, n, sum, least, d);
        worst = x > worst ? x : worst;
    }
    return worst < ring ? worst : ring;
}

int64_t mf_layout_op_bytes(const mf_schedule *s, const mf_op *op)
{
    if (!mf_opkind_is_collective(op->kind) || op->axis < 0 || op->axis >= s->mesh.naxes)
        return 0;
    const mf_bucket *b = op->bucket >= 0 && op->bucket < s->nbuckets ? &s->buckets[op->bucket] : NULL;
    bool ends = op->src >= 0 && op->src < s->nbuffers && op->dst >= 0 && op->dst < s->nbuffers;
    if (!b || !ends)
        return mf_schedule_collective_bytes(op->kind, s->mesh.axes[op->axis].size, op->count, op->dtype);
    const mf_placement *side =
        mf_layout_shard_side(op->kind, &s->buffers[op->src].place, &s->buffers[op->dst].place);
    return mf_layout_collective_bytes(&s->mesh, b, op->kind, op->axis, side, op->count, op->dtype);
}
