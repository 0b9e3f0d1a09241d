/*
 * mf_abi: the checks of the configuration structs' size and version, their
 * init functions (each one the header's initializer macro), and the static
 * asserts that tie the public ABI to the internal types it is cast to. A
 * public enum value that drifts from the internal one breaks the build here,
 * not a trainer at run time.
 */
#include "mf_abi.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>

#include "mf_schedule.h"
#include "mfsdp_ckpt.h"
#ifdef MFSDP_HAVE_CUDA
#include "mfsdp_nccl.h"
#endif

/* ---- public enums and constants = the internal ones they are cast to ---- */

/* mfsdp_dtype <-> mf_dtype (views, tensor infos, helpers, checkpoints). */
_Static_assert(MFSDP_FP32 == (int)MF_FP32 && MFSDP_BF16 == (int)MF_BF16 && MFSDP_FP16 == (int)MF_FP16,
               "mfsdp_dtype must equal mf_dtype");
_Static_assert(MF_DTYPE_COUNT == 3, "a new mf_dtype needs its mfsdp_dtype");
/* MFSDP_STREAM_* <-> mf_stream (mfsdp_nccl_stream, mfsdp_nccl_op_time.stream, stats). */
_Static_assert(MFSDP_STREAM_COMPUTE == (int)MF_STREAM_COMPUTE && MFSDP_STREAM_INNER == (int)MF_STREAM_INNER &&
                   MFSDP_STREAM_OUTER == (int)MF_STREAM_OUTER && MFSDP_NUM_STREAMS == (int)MF_STREAM_COUNT,
               "MFSDP_STREAM_* must equal mf_stream");
/* Array bounds copied between the schedule and the public structs. */
_Static_assert(MFSDP_MAX_AXES == MF_MAX_AXES, "mfsdp_stats' per-axis arrays are the schedule's axes");
_Static_assert(MFSDP_MAX_DIMS == MF_MAX_DIMS, "tensor infos and views copy the schedule's dims");
/* Result codes travel between ranks as ints (create's and the checkpoints'
 * exchanges) and are cast back; the Python binding declares every enum as a
 * C int. */
_Static_assert(sizeof(mfsdp_result) == sizeof(int) && sizeof(mfsdp_dtype) == sizeof(int) &&
                   sizeof(mfsdp_backend) == sizeof(int) && sizeof(mfsdp_reduce_op) == sizeof(int),
               "public enums are C ints");
_Static_assert(MFSDP_RESULT_COUNT == MFSDP_ERR_INTERNAL + 1, "results are 0..MFSDP_RESULT_COUNT-1");

/* ---- layouts the Python binding and the checks rely on ---- */

/* Every configuration struct begins with size, then version. */
#define MF_ABI_HEADER_ASSERT(type)                                                         \
    _Static_assert(offsetof(type, size) == 0 && offsetof(type, version) == sizeof(size_t) && \
                       sizeof(((type *)0)->version) == sizeof(uint32_t),                     \
                   #type " begins with size and version")
MF_ABI_HEADER_ASSERT(mfsdp_config);
MF_ABI_HEADER_ASSERT(mfsdp_ckpt_save_options);
MF_ABI_HEADER_ASSERT(mfsdp_ckpt_load_options);
MF_ABI_HEADER_ASSERT(mfsdp_hf_options);
#ifdef MFSDP_HAVE_CUDA
MF_ABI_HEADER_ASSERT(mfsdp_nccl_config);
/* python/mfsdp/_lib.py: unique_id is 128 bytes, the handles are pointers. */
_Static_assert(sizeof(ncclUniqueId) == 128, "mfsdp_nccl_config.unique_id is 128 bytes");
_Static_assert(sizeof(ncclComm_t) == sizeof(void *) && sizeof(cudaStream_t) == sizeof(void *),
               "NCCL and CUDA handles are pointers");
#endif

/* ---- checks ---- */

/* "mfsdp_config" -> "MFSDP_CONFIG_INIT or mfsdp_config_init()". */
static void initializers(const char *type, char *out, size_t len)
{
    char macro[64];
    size_t i = 0;
    for (; type[i] && i + 1 < sizeof macro; i++)
        macro[i] = (char)toupper((unsigned char)type[i]);
    macro[i] = '\0';
    snprintf(out, len, "%s_INIT or %s_init()", macro, type);
}

mfsdp_result mf_abi_check(const char *type, size_t size, uint32_t version, size_t known, char *err,
                          size_t errlen)
{
    if (size == known && version == MFSDP_ABI_VERSION)
        return MFSDP_OK;
    char init[160];
    initializers(type, init, sizeof init);
    /* Short enough for a checkpoint round's message (175 characters). */
    if (size == 0 || version == 0)
        snprintf(err, errlen, "%s was never initialized (size %zu, version %u): initialize it with %s", type,
                 size, (unsigned)version, init);
    else if (size > known || version > MFSDP_ABI_VERSION)
        snprintf(err, errlen, "%s is from a newer header (size %zu, version %u; this library %zu, %d): "
                 "initialize it with %s", type, size, (unsigned)version, known, MFSDP_ABI_VERSION, init);
    else
        snprintf(err, errlen, "%s has an unknown size %zu, version %u (this library %zu, %d): initialize it with %s",
                 type, size, (unsigned)version, known, MFSDP_ABI_VERSION, init);
    return MFSDP_ERR_INVALID_ARGUMENT;
}

mfsdp_result mf_abi_check_config(const mfsdp_config *cfg, char *err, size_t errlen)
{
    mfsdp_result res = MF_ABI_CHECK(mfsdp_config, cfg, err, errlen);
#ifdef MFSDP_HAVE_CUDA
    bool gpu = cfg->backend == MFSDP_BACKEND_NCCL || cfg->backend == MFSDP_BACKEND_CUDA_LOCAL;
    if (res == MFSDP_OK && gpu && cfg->backend_config)
        res = MF_ABI_CHECK(mfsdp_nccl_config, (const mfsdp_nccl_config *)cfg->backend_config, err, errlen);
#endif
    return res;
}

/* ---- init functions: each fills its struct with the header's macro ---- */

MFSDP_API void mfsdp_ckpt_save_options_init(mfsdp_ckpt_save_options *opt)
{
    if (opt)
        *opt = (mfsdp_ckpt_save_options)MFSDP_CKPT_SAVE_OPTIONS_INIT;
}

MFSDP_API void mfsdp_ckpt_load_options_init(mfsdp_ckpt_load_options *opt)
{
    if (opt)
        *opt = (mfsdp_ckpt_load_options)MFSDP_CKPT_LOAD_OPTIONS_INIT;
}

MFSDP_API void mfsdp_hf_options_init(mfsdp_hf_options *opt)
{
    if (opt)
        *opt = (mfsdp_hf_options)MFSDP_HF_OPTIONS_INIT;
}

#ifdef MFSDP_HAVE_CUDA
MFSDP_API void mfsdp_nccl_config_init(mfsdp_nccl_config *nc)
{
    if (nc)
        *nc = (mfsdp_nccl_config)MFSDP_NCCL_CONFIG_INIT;
}
#endif
