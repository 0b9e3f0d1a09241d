/*
 * mf_ckpt_hf_read: reading a Hugging Face tensor's element range with the
 * conversion to the runtime's dtypes (the CPU kernels'), for the runtime's
 * import and the offline tool. The engine-free parts of the Hugging Face
 * support (opening, name rules, matching) are in ckpt/mf_ckpt_hf.h.
 */
#ifndef MF_CKPT_HF_READ_H
#define MF_CKPT_HF_READ_H

#include "mf_ckpt_hf.h"

/* Elements [start, end) of tensor t, converted to dst_dtype, into dst. */
int mf_hf_read(const mf_hf_model *m, int t, int64_t start, int64_t end, void *dst, mf_dtype dst_dtype, char *err,
               size_t errlen);

#endif
