/*
 * mf_abi: the public ABI as data (docs/runtime.md, "Configuration structs").
 *
 * Every configuration struct of the public headers begins with `size` (sizeof
 * the struct as the caller compiled it) and `version` (the caller's
 * MFSDP_ABI_VERSION); its initializer macro and init function set both. The
 * library reads no other field of a struct before mf_abi_check accepted its
 * size and version. mf_abi.c also holds the static asserts that tie each
 * public enum and constant to the internal one it is cast to, and the layout
 * facts the Python binding relies on.
 */
#ifndef MF_ABI_H
#define MF_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "mfsdp.h"

/* MFSDP_OK when a `type` (its name: "mfsdp_config") whose leading fields say
 * `size` and `version` is the one this library was built with (`known` bytes,
 * MFSDP_ABI_VERSION); else MFSDP_ERR_INVALID_ARGUMENT with a message in err
 * naming the struct, what is wrong (never initialized, from a newer header)
 * and its initializers. */
mfsdp_result mf_abi_check(const char *type, size_t size, uint32_t version, size_t known, char *err,
                          size_t errlen);
#define MF_ABI_CHECK(type, p, err, errlen) \
    mf_abi_check(#type, (p)->size, (p)->version, sizeof(type), (err), (errlen))

/* mfsdp_create's check of its config (non-NULL): the mfsdp_config, then the
 * mfsdp_nccl_config a GPU backend reads from backend_config; mf_abi_check's
 * result and message. */
mfsdp_result mf_abi_check_config(const mfsdp_config *cfg, char *err, size_t errlen);

#endif
