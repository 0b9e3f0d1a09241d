/*
 * mf_ckpt_build: what a save writes, from a plan (mf_ckpt_plan.h), shared by
 * the runtime's save and the offline tools (reshard, import): the entries of
 * one rank's data file, in file order (state by state, the rank's pieces in
 * plan order within each, then the user blob), and the manifest from every
 * rank's report. Both sides compute the same layout from the plan alone.
 * Entries and manifest pieces name the checkpoint tensor's elements: a
 * split global tensor's pieces (plan tensors in local elements) are written
 * as their ranges of W (mf_ckpt_plan_gstart), W listed once (plan.nmt
 * tensors, by mt).
 */
#ifndef MF_CKPT_BUILD_H
#define MF_CKPT_BUILD_H

#include "mf_ckpt_io.h"
#include "mf_ckpt_plan.h"

/* The states of a save: [0] is main_weight. */
typedef struct mf_ckpt_states {
    int n;
    const char *name[64];
    mf_dtype dtype[64];
} mf_ckpt_states;

/* What rank r reports after writing its file. */
typedef struct mf_ckpt_report {
    int has_file;
    uint64_t bytes, header_bytes, blob_bytes;
    uint32_t crc32c;
} mf_ckpt_report;

/* Entries of rank r's file: states x pieces, then "user_blob" when
 * blob_bytes > 0 (data pointers NULL). *out is malloc'd (free names with
 * mf_ckpt_build_entries_free). Returns 0 or -1 (out of memory). Entry i < n_pieces
 * * states.n is (state i / np, piece p->first[r] + i % np). */
int mf_ckpt_build_entries(const mf_ckpt_plan *p, int64_t r, const mf_ckpt_states *st, uint64_t blob_bytes,
                          mf_ckpt_wentry **out, int *n);
void mf_ckpt_build_entries_free(mf_ckpt_wentry *e, int n);
/* "rank-%05lld.safetensors" */
void mf_ckpt_build_file_name(int64_t r, char *buf, size_t size);
/* The manifest text (malloc'd) of a save of schedule s with plan p and the
 * reports of every rank (world entries). NULL when out of memory. */
char *mf_ckpt_build_manifest(const mf_schedule *s, const mf_ckpt_plan *p, const mf_ckpt_states *st,
                             const char *id, int64_t step, const mf_ckpt_report *rep);
/* A fresh random checkpoint id (32 hex digits). */
void mf_ckpt_build_new_id(char id[33]);
/* An offline save into `out` (the tools' reshard and import), committed
 * like a runtime save. Begin: refuses an existing out (a checkpoint is
 * never overwritten), picks a fresh id and creates the temporary directory
 * out.tmp-ID (its path into tmp[tmplen]). Finish: the manifest of schedule s
 * with plan p, states st, step and every rank's report, written into tmp
 * and fsync'd, then tmp committed to out (mf_ckpt_write_commit_dir). Both return
 * 0, or -1 with a message; on a failure after begin the caller removes tmp
 * (mf_ckpt_io_remove_dir). */
int mf_ckpt_build_begin_dir(const char *out, char id[33], char *tmp, size_t tmplen, char *err, size_t errlen);
int mf_ckpt_build_finish_dir(const mf_schedule *s, const mf_ckpt_plan *p, const mf_ckpt_states *st, const char *id,
                             int64_t step, const mf_ckpt_report *rep, const char *tmp, const char *out, char *err,
                             size_t errlen);

#endif
