/*
 * mf_ckpt_global: what a checkpoint needs of a schedule before it names
 * tensors across the mesh. A checkpoint, DCP and the Hugging Face
 * export/import know one tensor per name across the whole mesh; a schedule
 * with a Distinct axis (docs/semantics.md §4.7) holds a different tensor
 * under the same name on each coordinate of that axis (another expert set, a
 * TP shard). Native checkpoints (mfsdp_ckpt_save, mfsdp_ckpt_load) write and
 * read its global tensors when every Distinct tensor has global names of the
 * rename form (`global "TEMPLATE"`, docs/language.md §3.4): each rank's
 * tensor under the global name of its coordinate. They refuse a Distinct
 * tensor without global names and the split form; the Hugging Face
 * export/import (mfsdp_ckpt_export_hf, mfsdp_ckpt_import_hf) still refuses
 * every schedule with a Distinct axis. Each refusal comes before touching any
 * file, with the same answer on every rank (the schedule is the same).
 */
#ifndef MF_CKPT_GLOBAL_H
#define MF_CKPT_GLOBAL_H

#include <stdbool.h>

#include "mf_base.h"

/* MFSDP_OK, or MFSDP_ERR_UNSUPPORTED set on rt (naming fn and what is
 * missing) when rt's schedule cannot be checkpointed: for the native format
 * (hf false), a Distinct tensor without rename global names; for the Hugging
 * Face export/import (hf true), any Distinct axis. */
mfsdp_result mf_ckpt_global_check(mf_rt *rt, const char *fn, bool hf);
/* The checkpoint name of runtime tensor `view` on this rank: its global
 * name for the rank's coordinate when it is Distinct, else its name. */
const char *mf_ckpt_global_name(mf_rt *rt, int view);
/* Whether `name` is the checkpoint name of some tensor of the schedule on
 * some coordinate. */
bool mf_ckpt_global_known(mf_rt *rt, const char *name);

#endif
