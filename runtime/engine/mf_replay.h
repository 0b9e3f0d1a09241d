/*
 * mf_replay: the replay engine's host side (mf_replay.c): the per-hook op
 * lists built at create, and the hook entry points of mfsdp.h (defined
 * there), which check the call (mf_trace.h), issue the list's ops
 * (mf_streams.h, or the backend's submit on a native backend) and advance
 * the hook state.
 */
#ifndef MF_REPLAY_H
#define MF_REPLAY_H

#include "mf_base.h"

/* Builds rt->list_start/list_ops. */
mfsdp_result mf_replay_build_lists(mf_rt *rt);
/* A stream's queue capacity: the most entries it is issued in one full
 * step, plus the short-step and evaluation programs' ops on it. */
int64_t mf_replay_stream_capacity(const mf_rt *rt, mf_stream st);

#endif
