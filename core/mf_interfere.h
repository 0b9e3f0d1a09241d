/*
 * mf_interfere: the interference lower bound on a schedule's transient arena
 * (docs/semantics.md §10). Two transient buffers interfere when some segment
 * of one meets some segment of the other in time (mf_live_overlap). With one
 * offset per buffer for the whole run (the trainer's views are fixed,
 * docs/runtime.md §6), buffers that pairwise interfere must be pairwise
 * disjoint in memory, so the bytes of any such set (a clique of the
 * interference graph) bound every valid arena from below. The buffers live at
 * the peak instant form one clique (the live-bytes bound); the heaviest clique
 * can be larger, because a buffer's forward and backward segments meet
 * different buffers.
 *
 * The search is an exact branch and bound (vertices by weight, Östergård's
 * bound per suffix plus the remaining-weight sum) started from the peak
 * instant's set, under a fixed work budget counted in visited nodes and list
 * entries (deterministic: the same schedule always gives the same answer). When
 * the budget runs out the heaviest clique found is kept: still a lower bound,
 * marked inexact ("at least").
 *
 * Ownership: mf_interfere_bound fills an mf_interfere whose members array is
 * malloc'ed; mf_interfere_free releases it.
 */
#ifndef MF_INTERFERE_H
#define MF_INTERFERE_H

#include "mf_live.h"

typedef struct mf_interfere {
    int64_t bytes;          /* aligned bytes of the heaviest clique found */
    bool exact;             /* the search finished: no clique is heavier */
    int nmembers;
    int *members;           /* its buffers, ascending index */
} mf_interfere;

/* The work budget of one search (node visits plus candidate-list entries). */
#define MF_INTERFERE_WORK (1 << 23)

/* Fills out for s and its live intervals lv, with at most `budget` units of
 * work (MF_INTERFERE_WORK in the tool). Returns false on OOM (out zeroed). */
bool mf_interfere_bound(const mf_schedule *s, const mf_live *lv, int64_t budget, mf_interfere *out);
void mf_interfere_free(mf_interfere *x);

/* The search alone, on a graph given directly (for the tests): n vertices of
 * weight w[i]; the neighbours of i are adj[adj_start[i] .. adj_start[i+1])
 * (symmetric, no self loops, any order). seed (nseed vertices, a clique, may
 * be empty) is the starting incumbent. Fills out with vertex indices as
 * members. Returns false on OOM. */
bool mf_interfere_clique(int n, const int64_t *w, const int *adj_start, const int *adj, const int *seed,
                         int nseed, int64_t budget, mf_interfere *out);

#endif
