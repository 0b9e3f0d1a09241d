/*
 * gmn_fault: the injected faults of the NCCL model, GM_NCCL_FAULT =
 * "rank=R,after=N,kind=stop|async[,comm=NAME]", read once. It hits every
 * communicator whose root rank (the rank in the communicator made from a
 * unique id that it descends from: splits keep it) is R, or only the one
 * named NAME (ncclConfig_t.commName); N counts that communicator's completed
 * collectives. stop: the collective after N never arrives (gmn_coll.c);
 * async: ncclSystemError becomes the asynchronous error after N (N = 0: at
 * creation). A malformed value is reported with the value and exit 2.
 */
#include "gmn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static gmn_fault fault;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

static _Noreturn void fault_bad(const char *v, const char *why)
{
    fprintf(stderr, "gpumodel: GM_NCCL_FAULT=%s: %s (expected rank=R,after=N,kind=stop|async[,comm=NAME])\n", v,
            why);
    _exit(2);
}

static void fault_parse(void)
{
    const char *v = getenv("GM_NCCL_FAULT");
    if (!v || !*v)
        return;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    bool have_rank = false, have_kind = false;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            fault_bad(v, "a field without '='");
        *eq = '\0';
        const char *val = eq + 1;
        char *end = NULL;
        if (!strcmp(tok, "rank")) {
            long r = strtol(val, &end, 10);
            if (end == val || *end || r < 0)
                fault_bad(v, "rank is not a rank number");
            fault.rank = (int)r;
            have_rank = true;
        } else if (!strcmp(tok, "after")) {
            unsigned long long n = strtoull(val, &end, 10);
            if (end == val || *end || *val == '-')
                fault_bad(v, "after is not a count of collectives");
            fault.after = n;
        } else if (!strcmp(tok, "kind")) {
            fault.kind = !strcmp(val, "stop") ? GMN_FAULT_STOP : !strcmp(val, "async") ? GMN_FAULT_ASYNC : 0;
            if (!fault.kind)
                fault_bad(v, "kind must be stop or async");
            have_kind = true;
        } else if (!strcmp(tok, "comm")) {
            snprintf(fault.comm, sizeof fault.comm, "%s", val);
        } else {
            fault_bad(v, "unknown field");
        }
    }
    if (!have_rank || !have_kind)
        fault_bad(v, "rank and kind are required");
}

const gmn_fault *gmn_fault_for(const struct ncclComm *comm)
{
    pthread_once(&fault_once, fault_parse);
    if (!fault.kind || fault.rank != comm->root_rank || (fault.comm[0] && strcmp(fault.comm, comm->comm_name)))
        return NULL;
    return &fault;
}

