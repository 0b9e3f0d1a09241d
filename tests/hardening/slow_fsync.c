/*
 * LD_PRELOAD shim for cli_commit.sh: fsync sleeps MFSDP_SLOW_FSYNC_MS
 * (default 3000) first, so a test can signal mfsdpc while its temporary
 * output exists (mf_outputs fsyncs each temporary before the renames).
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fsync");
    const char *ms = getenv("MFSDP_SLOW_FSYNC_MS");
    long wait = ms ? atol(ms) : 3000;
    struct timespec ts = {wait / 1000, (wait % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return real ? real(fd) : 0;
}
