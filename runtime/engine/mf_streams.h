/*
 * mf_streams: the worker execution model of the CPU backends (mf_streams.c):
 * one thread per communication stream, event counters, op execution. Used
 * by create/destroy (start, stop) and the replay engine (issue, kick,
 * drain); a native backend (CUDA/NCCL) runs none of it.
 */
#ifndef MF_STREAMS_H
#define MF_STREAMS_H

#include "mf_base.h"

/* Starts the inner and outer stream threads (at create, before the ranks'
 * exchange, so that a failure is announced to the peers). */
mfsdp_result mf_streams_start(mf_rt *rt);
/* Test hook (fault injection): the next stream thread that any runtime of
 * this process starts fails as if pthread_create had returned EAGAIN; once. */
void mf_streams_fail_next_start(void);
/* Stops and joins them (pending entries are dropped). */
void mf_streams_stop(mf_rt *rt);
/* Issues one op of the worker model: compute-stream ops run here (time
 * blocked in event waits added to *wait_ns), others are queued to their
 * stream. */
mfsdp_result mf_streams_issue(mf_rt *rt, int op, int64_t microbatch, int64_t seq,
                              int64_t *wait_ns);
/* Wakes the stream threads that have entries queued (end of a hook). */
void mf_streams_kick(mf_rt *rt);
/* Waits until every queued entry completed (bounded by the timeout). */
mfsdp_result mf_streams_drain(mf_rt *rt);
/* True while some entry is queued or running. */
bool mf_streams_busy(mf_rt *rt);
/* Runs one op on the calling thread (stream threads, compute ops, synchronous mode). */
mfsdp_result mf_streams_exec(mf_rt *rt, mf_stream on, const mf_rt_entry *e, char *err,
                             size_t errlen, int64_t *wait_ns);

#endif
