/*
 * gmn_stats: the NCCL model's counters (gm_nccl.h) and the summary line
 * GM_NCCL_SUMMARY prints at exit. Counters only grow (until
 * gm_nccl_stats_reset) and are updated with atomics from any thread.
 */
#include "gmn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gm_nccl.h"

_Atomic unsigned long gmn_stat_colls, gmn_stat_registered, gmn_stat_aborts, gmn_stat_mismatches;
_Atomic unsigned long gmn_stat_kind[GMN_NKINDS];

void gm_nccl_stats(gm_nccl_counters *out)
{
    out->collectives = atomic_load(&gmn_stat_colls);
    out->registered = atomic_load(&gmn_stat_registered);
    out->mismatches = atomic_load(&gmn_stat_mismatches);
    out->aborts = atomic_load(&gmn_stat_aborts);
    for (int k = 0; k < GMN_NKINDS; k++)
        out->by_kind[k] = atomic_load(&gmn_stat_kind[k]);
}

void gm_nccl_stats_reset(void)
{
    atomic_store(&gmn_stat_colls, 0);
    atomic_store(&gmn_stat_registered, 0);
    atomic_store(&gmn_stat_mismatches, 0);
    atomic_store(&gmn_stat_aborts, 0);
    for (int k = 0; k < GMN_NKINDS; k++)
        atomic_store(&gmn_stat_kind[k], 0);
}

__attribute__((destructor)) static void summary(void)
{
    const char *v = getenv("GM_NCCL_SUMMARY");
    if (!v || !*v)
        return;
    FILE *f = strcmp(v, "-") == 0 ? stderr : fopen(v, "a");
    if (!f)
        return;
    fprintf(f,
            "gpumodel: nccl: pid=%d collectives=%lu registered=%lu mismatches=%lu aborts=%lu allgather=%lu "
            "reducescatter=%lu allreduce=%lu reduce=%lu broadcast=%lu alltoall=%lu gather=%lu scatter=%lu\n",
            (int)getpid(), atomic_load(&gmn_stat_colls), atomic_load(&gmn_stat_registered),
            atomic_load(&gmn_stat_mismatches), atomic_load(&gmn_stat_aborts), atomic_load(&gmn_stat_kind[0]),
            atomic_load(&gmn_stat_kind[1]), atomic_load(&gmn_stat_kind[2]), atomic_load(&gmn_stat_kind[3]),
            atomic_load(&gmn_stat_kind[4]), atomic_load(&gmn_stat_kind[5]), atomic_load(&gmn_stat_kind[6]),
            atomic_load(&gmn_stat_kind[7]));
    if (f != stderr)
        fclose(f);
}
