/*
 * mf_ckpt_hf_rt: what the runtime's Hugging Face import (mf_ckpt_hf_rt.c)
 * and export (mf_ckpt_hf_export.c) share beyond the format engine of
 * ckpt/mf_ckpt_hf.h: the checks they begin with, the global model they
 * write and read (ckpt/mf_ckpt_hf_global.h: a Distinct tensor is written
 * and read under its global names, each coordinate its own tensor or its
 * slice of a split one) and the rounds in which the ranks agree.
 */
#ifndef MF_CKPT_HF_RT_H
#define MF_CKPT_HF_RT_H

#include <stddef.h>

#include "mf_ckpt_hf.h"
#include "mf_ckpt_hf_global.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

/* The entry of the collective call fn (an import or an export): rt not NULL
 * ("fn: NULL runtime"), usable (mf_base_handle_check), every rank at this
 * call (mf_agree_helper, docs/runtime.md §4.4), and the schedule's global
 * model built into *g (ckpt/mf_ckpt_hf_global.h: a Distinct tensor without
 * global names is refused with MFSDP_ERR_UNSUPPORTED, naming it and the
 * clause to add; the same answer on every rank, before any file). MFSDP_OK
 * (release *g with mf_hf_global_free), or the failure's result (the
 * runtime's error set; *g empty). */
mfsdp_result mf_ckpt_hf_rt_enter(mf_rt *rt, const char *fn, mf_hf_global *g);
/* Where runtime tensor `view` of this rank lands in the global model g. */
mf_hf_place mf_ckpt_hf_rt_place(mf_rt *rt, const mf_hf_global *g, int view);
/* The checks an import and an export begin with, in this order: the stage
 * hook's start when staged (mf_ckpt_stage.h), the options' size and
 * version, then the caller's arguments (args_ok) and the options' rules
 * (added to r). MFSDP_OK, or the failure's result with its message in err
 * (`usage` for bad arguments or rules). */
mfsdp_result mf_ckpt_hf_rt_begin(mf_rt *rt, const mfsdp_hf_options *opt, int args_ok, const char *usage,
                                 mf_hf_rules *r, char *err, size_t errlen);
/* One round over the world (be->exchange): sends mine, fills all[world]. A
 * message is `size` bytes: an int64_t status (MFSDP_OK or the failure's
 * result), then the failure's NUL-terminated text. On a failed exchange,
 * this rank's failure (own: its full text) or another rank's (the first),
 * sets the runtime's error ("Hugging Face WHAT VERDICT: ...", e.g. "export
 * failed", "import refused") and returns it; else MFSDP_OK. */
mfsdp_result mf_ckpt_hf_rt_round(mf_rt *rt, const void *mine, void *all, size_t size, const char *what,
                                 const char *verdict, const char *own);

#endif
