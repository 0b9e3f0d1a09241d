/*
 * mf_ckpt_global: what a checkpoint needs of a schedule before it names
 * tensors across the mesh. A checkpoint, DCP and the Hugging Face
 * export/import know one tensor per name across the whole mesh; a schedule
 * with a Distinct axis (docs/semantics.md §4.7) holds a different tensor
 * under the same name on each coordinate of that axis (another expert set, a
 * TP shard), and saving it needs the global naming of distinct tensors
 * (issue #42, item 2) that does not exist yet. Until it does, every
 * checkpoint entry point of the runtime (mfsdp_ckpt_save, mfsdp_ckpt_load,
 * mfsdp_ckpt_export_hf, mfsdp_ckpt_import_hf) refuses such a schedule here,
 * before touching any file, with the same answer on every rank.
 */
#ifndef MF_CKPT_GLOBAL_H
#define MF_CKPT_GLOBAL_H

#include "mf_base.h"

/* MFSDP_OK, or MFSDP_ERR_UNSUPPORTED set on rt (naming fn, the first
 * Distinct axis and its bucket) when rt's schedule has a Distinct axis. */
mfsdp_result mf_ckpt_global_check(mf_rt *rt, const char *fn);

#endif
