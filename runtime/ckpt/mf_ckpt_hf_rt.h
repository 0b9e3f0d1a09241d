/*
 * mf_ckpt_hf_rt: what the runtime's Hugging Face import (mf_ckpt_hf_rt.c)
 * and export (mf_ckpt_hf_export.c) share beyond the format engine of
 * ckpt/mf_ckpt_hf.h: the rounds in which the ranks agree.
 */
#ifndef MF_CKPT_HF_RT_H
#define MF_CKPT_HF_RT_H

#include <stddef.h>

#include "mf_rt.h"

/* One round over the world (be->exchange): sends mine, fills all[world]. A
 * message is `size` bytes: an int64_t status (MFSDP_OK or the failure's
 * result), then the failure's NUL-terminated text. On a failed exchange,
 * this rank's failure (own: its full text) or another rank's (the first),
 * sets the runtime's error ("Hugging Face WHAT VERDICT: ...", e.g. "export
 * failed", "import refused") and returns it; else MFSDP_OK. */
mfsdp_result mf_ckpt_hf_rt_round(mf_rt *rt, const void *mine, void *all, size_t size, const char *what,
                         const char *verdict, const char *own);

#endif
