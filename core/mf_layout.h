/*
 * mf_layout: the layout math of docs/semantics.md §2, shared by the planner, the
 * verifier and the runtime. One function answers "which elements of a bucket
 * does rank r hold under placement p": mf_layout_bucket_range() (equal shards,
 * mf_layout_range(), for a bucket without bounds; the ragged shards of a whole
 * bucket's bounds otherwise, docs/semantics.md §4.6).
 *
 * Rank <-> coords is row-major with the innermost (last) axis fastest.
 * Shard order is inner-major: the innermost Flat axis splits the whole buffer,
 * each Flat axis further out splits the shard of the axis inside it:
 *     q = sum_{j=s}^{k-1} c_j * prod_{l=s}^{j-1} n_l,   len = L / prod n_j,
 *     offset = q * len.
 */
#ifndef MF_LAYOUT_H
#define MF_LAYOUT_H

#include "mf_schedule.h"

typedef struct mf_range {
    int64_t offset;   /* first element, bucket-global */
    int64_t len;      /* elements */
} mf_range;

/* coords[j] of rank r; r in [0, world). */
void mf_layout_mesh_coords(const mf_mesh *m, int64_t rank, int64_t coords[MF_MAX_AXES]);
/* Inverse of mf_layout_mesh_coords. */
int64_t mf_layout_mesh_rank(const mf_mesh *m, const int64_t coords[MF_MAX_AXES]);
/* The ranks of rank r's axis group along axis j, ordered by c_j; writes
 * mesh->axes[j].size ranks into out. */
void mf_layout_axis_group(const mf_mesh *m, int axis, int64_t rank, int64_t *out);
/* Index of rank r's axis group along axis j (the "color"): ranks with equal
 * coords on every other axis share it. */
int64_t mf_layout_axis_color(const mf_mesh *m, int axis, int64_t rank);

/* First axis of the Flat suffix: s such that axes s..k-1 are Flat; k if none. */
int mf_layout_flat_start(const mf_placement *p, int naxes);
/* True when the Flat axes form a suffix of the mesh (docs/semantics.md §1). */
bool mf_layout_flat_suffix_ok(const mf_placement *p, int naxes);
/* Number of shards: product of the sizes of the Flat axes. */
int64_t mf_layout_shards(const mf_mesh *m, const mf_placement *p);
/* Shard index q of a rank with these coords. */
int64_t mf_layout_shard_index(const mf_mesh *m, const mf_placement *p,
                              const int64_t coords[MF_MAX_AXES]);
/* The elements of a bucket of padded length L (divisible by the shard count)
 * that rank r holds under placement p, when the bucket's shards are equal (no
 * bounds); callers with a bucket use mf_layout_bucket_range. */
mf_range mf_layout_range(const mf_mesh *m, const mf_placement *p, int64_t rank, int64_t L);

/* ---- shards of a bucket: equal, or ragged (docs/semantics.md §4.6) ----
 * A bucket with bounds (a whole bucket of format 7) has ragged shards: the
 * finest whole placement (mf_layout_bucket_fine, P shards) has shard q =
 * [bounds[q], bounds[q+1]); a placement p of the bucket with Pp shards, Pp
 * dividing P (its Flat axes a suffix of the finest's), k = P / Pp, has shard
 * q = [bounds[q*k], bounds[(q+1)*k]) (inner-major order makes them
 * contiguous). Without bounds the shards are equal: L / Pp each. These
 * functions answer every range question about a bucket; mf_layout_range is
 * the equal form alone. */

/* The shard quantum: the fewest elements that are a multiple of `align`
 * bytes in every role's dtype (lcm over the roles of align / gcd(align,
 * size)); every shard of a bucket starts on it. */
int64_t mf_layout_shard_quantum(const mf_dtype dt[MF_ROLE_COUNT], int64_t align);
/* The placement of b's whole role with the most shards (ties: the first
 * role), NULL when no role is whole. */
const mf_placement *mf_layout_bucket_fine(const mf_mesh *m, const mf_bucket *b);
/* Entries of b->bounds: the finest whole placement's shards + 1; 0 when no
 * role is whole. */
int64_t mf_layout_bucket_nbounds(const mf_mesh *m, const mf_bucket *b);
/* Whether placement p can be laid on b: always without bounds; with bounds
 * when p's shard count divides the finest's (a non-whole role with more
 * shards has no ragged shards: the checker and the loader refuse it). */
bool mf_layout_bucket_placement_ok(const mf_mesh *m, const mf_bucket *b, const mf_placement *p);
/* Shard q (in [0, mf_layout_shards(p))) of placement p of bucket b; {0, 0}
 * when q is out of range or p is not ok for b. */
mf_range mf_layout_bucket_shard(const mf_mesh *m, const mf_bucket *b, const mf_placement *p, int64_t q);
/* The elements of bucket b that rank r holds under placement p: its shard. */
mf_range mf_layout_bucket_range(const mf_mesh *m, const mf_bucket *b, const mf_placement *p, int64_t rank);
/* The longest shard of placement p of bucket b: a buffer's `count`, what a
 * rank may hold at most (L for an unsharded placement). */
int64_t mf_layout_bucket_capacity(const mf_mesh *m, const mf_bucket *b, const mf_placement *p);

/* The shard of placement p of bucket b (q in [0, mf_layout_shards)) that
 * holds the elements [offset, offset + numel) wholly, or -1 when they
 * straddle a shard boundary or pass the bucket's end. An empty range is held
 * by the first non-empty shard containing its offset. */
int64_t mf_layout_tensor_shard(const mf_mesh *m, const mf_bucket *b, const mf_placement *p, int64_t offset,
                               int64_t numel);
/* The used prefix of shard q of bucket b under placement p: elements from the
 * shard's start to the furthest tensor element inside it (a tensor that
 * straddles into the shard counts), 0 when no tensor overlaps it. Alignment
 * gaps between tensors are inside the prefix; the rest of the shard is padding.
 * A collective on a whole role moves only these prefixes
 * (docs/semantics.md §4.6). */
int64_t mf_layout_shard_used(const mf_mesh *m, const mf_placement *p, const mf_bucket *b,
                             int64_t q);

/* A bucket with some role placed Whole (mf_bucket.whole): its collectives move
 * only the used prefix of each shard (docs/semantics.md §4.6); with bounds
 * its shards are ragged (the prefix is then the whole shard but for the
 * alignment at its end). */
bool mf_layout_bucket_whole(const mf_bucket *b);
/* The placement a collective's shards are counted on: a reduce_scatter's
 * destination, an all_gather's source, an all_reduce's own (its source). */
const mf_placement *mf_layout_shard_side(mf_opkind k, const mf_placement *from, const mf_placement *to);
/* Bytes one rank sends for one launch of collective k on axis `axis` of
 * bucket b, `count` elements per rank of dtype d, its shards counted on
 * placement `shard` (mf_layout_shard_side). The one place bytes per op are
 * computed: mf_schedule_collective_bytes (the ring) for a bucket with no whole
 * role; for a whole bucket the used-prefix form, the most over the ranks: a
 * reduce_scatter or all_gather moves, for each other shard of the rank's axis
 * group, that shard's used prefix (mf_layout_shard_used) where the ring moves
 * `count`; an all_reduce runs the ring over the used prefix of the rank's own
 * shard. Never above the ring's bytes. */
int64_t mf_layout_collective_bytes(const mf_mesh *m, const mf_bucket *b, mf_opkind k, int axis,
                                   const mf_placement *shard, int64_t count, mf_dtype d);
/* One rank's bytes for one launch of collective k in the used-prefix form,
 * n members whose shards' used prefixes sum to `sum`, `own` this rank's:
 * (sum - own)·b for a reduce_scatter or all_gather (every other member's
 * prefix, sent or received), the ring all-reduce of `own` for an all_reduce.
 * mf_layout_collective_bytes is its most over the ranks; the runtime counts
 * it per rank (mfsdp_stats.bytes). */
int64_t mf_layout_prefix_bytes(mf_opkind k, int64_t n, int64_t sum, int64_t own, mf_dtype d);
/* mf_layout_collective_bytes of op (its buffers' placements); 0 for local ops. */
int64_t mf_layout_op_bytes(const mf_schedule *s, const mf_op *op);

#endif
