/*
 * mf_ckpt_global: what a checkpoint needs of a schedule before it names
 * tensors across the mesh. A checkpoint, DCP and the Hugging Face
 * export/import know one tensor per name across the whole mesh; a schedule
 * with a Distinct axis (docs/semantics.md §4.7) holds a different tensor
 * under the same name on each coordinate of that axis (another expert set, a
 * TP shard). Native checkpoints (mfsdp_ckpt_save, mfsdp_ckpt_load) write and
 * read its global tensors when every Distinct tensor has global names
 * (docs/language.md §3.4): the rename form `global "TEMPLATE"` names each
 * rank's tensor by its coordinate's global name; the split form `global "W"
 * split D` makes it a slice of the global W (mf_ckpt_plan.h: local element i
 * is element (i / run) * grow + gbase + i % run of W). They refuse a Distinct
 * tensor without global names, before touching any file, with the same
 * answer on every rank (the schedule is the same). The Hugging Face
 * export/import names the same global tensors (ckpt/mf_ckpt_hf_global.h).
 */
#ifndef MF_CKPT_GLOBAL_H
#define MF_CKPT_GLOBAL_H

#include <stdbool.h>

#include "mf_base.h"

/* MFSDP_OK, or MFSDP_ERR_UNSUPPORTED set on rt (naming fn and the tensor)
 * when a Distinct tensor of rt's schedule has no global names. */
mfsdp_result mf_ckpt_global_check(mf_rt *rt, const char *fn);
/* The checkpoint name of runtime tensor `view` on this rank: its global
 * name for the rank's coordinate when it is Distinct (the split form: W),
 * else its name. */
const char *mf_ckpt_global_name(mf_rt *rt, int view);
/* The local -> checkpoint element map of runtime tensor `view` on this rank
 * and the checkpoint tensor's dims (mf_ckpt_plan_gmap); returns the split
 * dim or -1. */
int mf_ckpt_global_map(mf_rt *rt, int view, int64_t *run, int64_t *grow, int64_t *gbase, int64_t *gdims);
/* Whether `name` is the checkpoint name of some tensor of the schedule on
 * some coordinate. */
bool mf_ckpt_global_known(mf_rt *rt, const char *name);

#endif
