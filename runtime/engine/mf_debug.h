/*
 * mf_debug: the check mode (MFSDP_FLAG_CHECK, or MFSDP_CHECK=1 in the
 * environment; docs/runtime.md, "Check mode"). It catches a trainer that
 * touches a tensor's weight or grad_local outside the window the hooks give
 * it: buffers outside their window hold a signalling-NaN pattern, grad_local
 * must be completely overwritten within its window, and the weight must not
 * change within its window.
 *
 * Called by the replay engine (mf_replay.c) around every hook of a runtime
 * whose rt->check is set; CPU backends only, and the runtime runs synchronously (every op
 * completes within its hook), so between hooks no op touches a buffer.
 */
#ifndef MF_DEBUG_H
#define MF_DEBUG_H

#include <stdint.h>

#include "mf_schedule.h"
#include "mfsdp.h"

typedef struct mfsdp_runtime mf_rt;
typedef struct mf_debug mf_debug;

/* cfg->flags plus what the environment asks for (MFSDP_CHECK=1 adds
 * MFSDP_FLAG_CHECK); the check mode also implies MFSDP_FLAG_SYNCHRONOUS. */
uint32_t mf_debug_flags(uint32_t flags);
/* Sets up rt->check when rt->cfg.flags has MFSDP_FLAG_CHECK and the
 * backend is a CPU one (needs the views); else leaves it NULL. Errors are
 * reported with mf_base_set_error(NULL, ...) like the rest of create. */
mfsdp_result mf_debug_create(mf_rt *rt);
void mf_debug_free(mf_rt *rt);
/* Before a hook's ops (list l): checks the windows that close here and
 * restores what the ops will read. A mistake returns MFSDP_ERR_INVALID_USAGE
 * with the tensor, the buffer and the first bad element in rt->err; the hook
 * then issues nothing. */
mfsdp_result mf_debug_before(mf_rt *rt, mf_phase phase, int unit, int64_t microbatch, int l);
/* After a hook's ops completed: opens this hook's windows and poisons
 * everything outside a window. */
void mf_debug_after(mf_rt *rt, mf_phase phase, int unit, int64_t microbatch);

#endif
