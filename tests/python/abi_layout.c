/*
 * abi_layout: prints the size and field offsets of every public struct that
 * the Python binding (python/mfsdp/_lib.py) declares with ctypes, one line
 * per field ("struct field offset" and "struct sizeof size"), so that
 * test_package.py can check the ctypes declarations against the C compiler's
 * layout, and the enum values and constants that _lib.py spells as numbers
 * ("enum NAME value"). The NCCL config is included when the library has the
 * backend.
 */
#include <stddef.h>
#include <stdio.h>

#include "mfsdp.h"
#include "mfsdp_ckpt.h"
#ifdef MFSDP_ABI_NCCL
#include "mfsdp_nccl.h"
#endif

#define F(s, f) printf("%s %s %zu\n", #s, #f, offsetof(s, f))
#define S(s) printf("%s sizeof %zu\n", #s, sizeof(s))
#define E(c) printf("enum %s %lld\n", #c, (long long)(c))

int main(void)
{
    S(mfsdp_tensor_info);
    F(mfsdp_tensor_info, name); F(mfsdp_tensor_info, unit); F(mfsdp_tensor_info, ndims);
    F(mfsdp_tensor_info, dims); F(mfsdp_tensor_info, numel);
    F(mfsdp_tensor_info, weight_dtype); F(mfsdp_tensor_info, grad_dtype);
    F(mfsdp_tensor_info, main_weight_dtype);
    S(mfsdp_tensor_view);
    F(mfsdp_tensor_view, name); F(mfsdp_tensor_view, unit); F(mfsdp_tensor_view, ndims);
    F(mfsdp_tensor_view, dims); F(mfsdp_tensor_view, numel); F(mfsdp_tensor_view, weight);
    F(mfsdp_tensor_view, weight_dtype); F(mfsdp_tensor_view, grad_local);
    F(mfsdp_tensor_view, grad_local_dtype); F(mfsdp_tensor_view, main_weight);
    F(mfsdp_tensor_view, main_weight_dtype); F(mfsdp_tensor_view, grad);
    F(mfsdp_tensor_view, grad_dtype); F(mfsdp_tensor_view, shard_offset);
    F(mfsdp_tensor_view, shard_count);
    S(mfsdp_config);
    F(mfsdp_config, backend); F(mfsdp_config, rank); F(mfsdp_config, timeout_ms);
    F(mfsdp_config, flags); F(mfsdp_config, local_group); F(mfsdp_config, mpi_comm);
    F(mfsdp_config, backend_config);
    S(mfsdp_stats);
    F(mfsdp_stats, steps); F(mfsdp_stats, ops); F(mfsdp_stats, collectives);
    F(mfsdp_stats, bytes); F(mfsdp_stats, busy_ns); F(mfsdp_stats, wait_ns);
    S(mfsdp_ckpt_state);
    F(mfsdp_ckpt_state, name); F(mfsdp_ckpt_state, dtype); F(mfsdp_ckpt_state, shards);
    S(mfsdp_ckpt_save_options);
    F(mfsdp_ckpt_save_options, step); F(mfsdp_ckpt_save_options, nstates);
    F(mfsdp_ckpt_save_options, states); F(mfsdp_ckpt_save_options, user_blob);
    F(mfsdp_ckpt_save_options, user_blob_bytes);
    S(mfsdp_ckpt_load_options);
    F(mfsdp_ckpt_load_options, flags); F(mfsdp_ckpt_load_options, nstates);
    F(mfsdp_ckpt_load_options, states); F(mfsdp_ckpt_load_options, user_blob_rank);
    F(mfsdp_ckpt_load_options, user_blob); F(mfsdp_ckpt_load_options, user_blob_capacity);
    F(mfsdp_ckpt_load_options, user_blob_bytes); F(mfsdp_ckpt_load_options, step);
    F(mfsdp_ckpt_load_options, bytes_read);
    S(mfsdp_hf_options);
    F(mfsdp_hf_options, nmaps); F(mfsdp_hf_options, maps); F(mfsdp_hf_options, nties);
    F(mfsdp_hf_options, ties);
    /* the enum values and constants that _lib.py spells as numbers */
    printf("enum sizeof(mfsdp_reduce_op) %zu\n", sizeof(mfsdp_reduce_op));
    E(MFSDP_REDUCE_SUM); E(MFSDP_REDUCE_MAX); E(MFSDP_REDUCE_MIN); E(MFSDP_ALL_RANKS);
    E(MFSDP_FLAG_SYNCHRONOUS); E(MFSDP_FLAG_CHECK);
    E(MFSDP_CKPT_VERIFY_FILES); E(MFSDP_FP32); E(MFSDP_BF16); E(MFSDP_FP16);
    E(MFSDP_BACKEND_LOCAL); E(MFSDP_BACKEND_MPI); E(MFSDP_BACKEND_NCCL);
    E(MFSDP_BACKEND_CUDA_LOCAL);
    E(MFSDP_OK); E(MFSDP_ERR_INVALID_USAGE); E(MFSDP_ERR_UNSUPPORTED); E(MFSDP_ERR_INTERNAL);
#ifdef MFSDP_ABI_NCCL
    S(mfsdp_nccl_config);
    F(mfsdp_nccl_config, world_comm); F(mfsdp_nccl_config, unique_id);
    F(mfsdp_nccl_config, has_unique_id); F(mfsdp_nccl_config, device);
    F(mfsdp_nccl_config, compute_stream); F(mfsdp_nccl_config, flags);
    F(mfsdp_nccl_config, watchdog_poll_ms);
#endif
    return 0;
}
