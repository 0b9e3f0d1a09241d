/*
 * mf_rt: the top of the runtime engine: mfsdp_create and mfsdp_destroy (a
 * rank's buffers, resolved ops, communicators, views, the world-wide
 * exchange of schedule hashes) and the small public queries (versions,
 * names, views, statistics). The runtime struct it fills is mf_base.h's; the
 * schedule handle is mf_rt_schedule.h's. Tools and tests that reach into a
 * runtime include this header (it brings both).
 *
 * Engine modules, bottom up (docs/runtime.md, "Source layout"):
 *
 *   mf_base.c          the runtime struct, accounted allocation, errors, time
 *   mf_abi.c           the public config structs' size and version checks
 *   mf_rt_schedule.c   the schedule handle: load, verify on load, queries
 *   mf_offload.c       MFSDP_FLAG_OFFLOAD_MAIN: main_weight in pinned host memory
 *   mf_stress.c        stress-mode delays
 *   mf_trace.c         the trace check (hook order)
 *   mf_debug.c         the check mode (tensor windows)
 *   mf_streams.c       the worker model: stream threads, event counters, op execution
 *   mf_replay.c        hook -> the ops to issue; per-hook op lists built at create
 *   mf_helpers.c       the public helpers (scatter, gather, all-reduce, grad norm)
 *   mf_rt.c            create/destroy, queries
 */
#ifndef MF_RT_H
#define MF_RT_H

#include "mf_base.h"
#include "mf_layout.h"
#include "mf_rt_schedule.h"

/* Buffer pointer of schedule buffer b (for tools and tests); NULL out of range. */
void *mf_rt_buffer(const mf_rt *rt, int b);

#endif
