/*
 * gm_nccl: what the CPU model of NCCL (libnccl.so.2 of tests/gpumodel/nccl)
 * exports beyond NCCL's API, for the model's self-tests. A trainer never
 * sees it; unchanged binaries get the same figures through the environment:
 * GM_NCCL_SUMMARY=- (stderr) or =<file> (appended) prints one line
 *   gpumodel: nccl: pid=P collectives=N registered=R mismatches=M aborts=A
 *   allgather=.. reducescatter=.. allreduce=.. reduce=.. broadcast=..
 *   alltoall=.. gather=.. scatter=..
 * at exit (one line).
 */
#ifndef GM_NCCL_H
#define GM_NCCL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_nccl_counters {
    unsigned long collectives;   /* collectives launched (each graph launch not counted) */
    unsigned long registered;    /* of them, with every buffer in a registration of the comm */
    unsigned long mismatches;    /* collectives that did not match across ranks (per rank) */
    unsigned long aborts;        /* ncclCommAbort calls on live communicators */
    unsigned long by_kind[8];    /* collectives launched: all-gather, reduce-scatter,
                                    all-reduce, reduce, broadcast, all-to-all,
                                    gather, scatter */
} gm_nccl_counters;

void gm_nccl_stats(gm_nccl_counters *out);
void gm_nccl_stats_reset(void);

#ifdef __cplusplus
}
#endif

#endif
